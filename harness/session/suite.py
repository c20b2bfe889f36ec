"""What one pytest run is about: platform, flavour, model, selected configs, run directory, servers."""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import urllib.parse
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from harness.config.catalog import UNDECLARED, Catalog, Config, Flavour, ServerSpec
from harness.core.errors import SuiteError
from harness.core.paths import REPO, slug, writable_dir
from harness.core.platform import UNKNOWN_PLATFORM, Platform, detect_platform
from harness.engine import hooks
from harness.engine.client import Client, NotAnOpenAIServer
from harness.engine.devices import machine_slot, server_gpus
from harness.engine.hub import check_hub_model
from harness.engine.models import ALIASES, Model, default_alias, resolve_model
from harness.engine.server import (
    SUITE_OWNED_FLAGS,
    ServerDied,
    VllmServer,
    installed_engine,
    profiler_args,
)

# GPU memory fraction of a server booted beside the shared one (0.70): level 3 runs two at once (the
# crash-prone tests' server and the fault-injection one), and at 0.2 each the second found too little free
# memory on an H200 and failed to boot. The tiny model needs a few GiB; KV-cache size does not matter there.
SECONDARY_GPU_FRACTION = 0.12
_BOOTS_LOCK = threading.Lock()


def _run_dir(option: str | None) -> Path:
    return writable_dir(Path(option) if option else REPO / "runs" / time.strftime("%Y%m%d-%H%M%S"), "--run-dir")


def _drop_if_empty(run_dir: Path) -> None:
    """Remove a run dir the suite named itself (runs/<time>) when nothing was written there: every pytest run,
    `--list-configs` and a refused option included, left an empty one behind (a CI run left hundreds)."""
    try:
        run_dir.rmdir()  # succeeds only on an empty folder: anything written there keeps it
    except OSError:
        pass


def external_platform(name: str | None, device: str | None) -> Platform:
    """What --platform / --device say about a server started elsewhere (UNKNOWN_PLATFORM without them)."""
    if name is None:
        return Platform(UNKNOWN_PLATFORM, device or "unknown device", None)
    if name != "cpu" and not re.fullmatch(r"sm_\d{2,3}", name):
        raise SuiteError(f"--platform {name}: expected cpu or a compute capability such as sm_90 or sm_121")
    capability = None if name == "cpu" else (int(name[3:-1]), int(name[-1]))
    return Platform(name, device or name, capability)


def _check_server_url(url: str) -> None:
    """A --server-url without a scheme (requests' InvalidSchema names no fix), with no host or a port out of range
    (was "cannot list models (InvalidURL ...); is the server up?"), or ending in /v1 (the OpenAI clients' base URL,
    which asked for /v1/v1/models, whose 404 said "not an OpenAI-compatible server"): one line naming the form."""
    if not url.startswith(("http://", "https://")):
        raise SuiteError(f"--server-url {url}: write the scheme too, e.g. --server-url=http://{url}")
    parts = urllib.parse.urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # a port that is not a number, or above 65535
        port_ok = False
    if not parts.hostname or not port_ok:
        raise SuiteError(f"--server-url {url}: not a server address; write http://HOST:PORT, e.g. "
                         "--server-url=http://127.0.0.1:8000")
    if parts.path.rstrip("/").endswith("/v1"):
        root = url[:url.rstrip("/").rfind("/v1")]
        raise SuiteError(f"--server-url {url}: pass the server's root, without /v1 (the suite adds /v1/...): "
                         f"--server-url={root}")


def external_model(url: str, model_option: str | None) -> Model:
    """The model an external server serves: --model's alias if given (it keys goldens), else its /v1/models id."""
    probe = Client(url.rstrip("/"), "", timeout_s=10)
    try:
        names = probe.models()
    except NotAnOpenAIServer as e:  # something else listens there: starting a server would not help
        raise SuiteError(f"--server-url {url}: cannot list models ({e}); check the address (its port)") from None
    except SuiteError as e:  # nothing listens, or it gave no answer in time
        raise SuiteError(f"--server-url {url}: cannot list models ({e}); is the server up?") from None
    if not names:
        raise SuiteError(f"--server-url {url}: /v1/models lists no model")
    if model_option:
        spec = ALIASES.get(model_option, {})
        return Model(model_option if model_option in ALIASES else slug(model_option), names[0],
                     weights="dummy" if "shape" in spec else "real")
    return Model(slug(names[0]), names[0])


@dataclass
class Target:
    """One configuration under test on this platform (runnable or with the reason it is not)."""

    name: str
    config: Config
    spec: ServerSpec | None
    runnable: bool
    reason: str


@dataclass
class RunningServer:
    """A booted (or external) server the tests talk to."""

    url: str
    served_name: str
    target: Target
    log_path: Path | None = None
    process: VllmServer | None = None  # None with --server-url
    boot_seconds: float | None = None
    trace_dir: Path | None = None
    slot: ExitStack | None = None  # the machine-wide slots its process holds for it, released when it stops

    @property
    def external(self) -> bool:
        return self.process is None

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        """`with suite.boot(...) as running:` stops a booted server's process group however the block ends."""
        self.stop()

    def stop(self) -> None:
        """Stop a booted server's process group (again: a no-op); an external server is left alone."""
        if self.process is not None:
            self.process.stop()
        if self.slot is not None:
            self.slot.close()  # an ExitStack closes once: stopping again releases nothing twice

    def ensure_alive(self) -> None:
        if self.process is not None:
            self.process.ensure_alive()

    def client(self, timeout_s: float = 300.0) -> Client:
        return Client(self.url, self.served_name, timeout_s=timeout_s, alive=self.ensure_alive)

    def log_text(self) -> str:
        if self.log_path is None:
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")


class StopAfterFolder:
    """Servers a test folder boots for itself (never the shared one), stopped after the folder's last test of the
    run instead of at the session's end: on a 24 GB CI box, level 3's and level 5's extra servers still up
    left level 6's combinations to the kernel's OOM killer. The folder's conftest calls `after_test` from its
    `pytest_runtest_teardown`."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder).resolve()
        self._stops: list[Callable[[], None]] = []

    def add(self, stop: Callable[[], None]) -> None:
        self._stops.append(stop)

    def after_test(self, nextitem: pytest.Item | None) -> None:
        if nextitem is None or self.folder not in Path(nextitem.path).parents:
            while self._stops:
                self._stops.pop()()


def refuse_empty(options: dict[str, str | None]) -> None:
    """An empty value (`--model=`, `--model ""`, an unset shell variable) was taken for no option: the default model,
    run dir or flavour ran in silence, in pytest and in every script that boots through Suite.create."""
    for option, value in options.items():
        if isinstance(value, str) and not value.strip():
            raise SuiteError(f"{option}={value!r} is empty; give it a value, or leave the option out for its default")


@dataclass
class Suite:
    catalog: Catalog
    platform: Platform
    flavour: Flavour
    model_or_error: Model | SuiteError
    run_dir: Path
    config_option: str | None
    server_url: str | None = None
    boot_timeout_s: float = 900.0
    boots: list[dict] = field(default_factory=list)
    server_args: list[str] = field(default_factory=list)  # --server-arg: appended to every boot's arguments
    allow_unverified: bool = False  # --allow-unverified: --force-regen records what level 1.5 cannot vouch for
    run_dir_default: bool = False  # named by the suite (runs/<time>), not by --run-dir: dropped when left empty

    @classmethod
    def create(
        cls, config_option: str | None, model_option: str | None, flavour_option: str | None,
        server_url: str | None, run_dir: str | None, boot_timeout_s: float,
        platform_option: str | None = None, device_option: str | None = None,
        server_args: list[str] | None = None, allow_unverified: bool = False,
    ) -> "Suite":
        """Validate every option now (collection time, one line each) and describe the run."""
        refuse_empty({"--model": model_option, "--flavour": flavour_option, "--server-url": server_url,
                      "--run-dir": run_dir, "--platform": platform_option, "--device": device_option})
        catalog = Catalog()
        for arg in server_args or []:
            if not arg.startswith("--"):
                raise SuiteError(f"--server-arg {arg!r}: pass one vLLM option per flag, as --server-arg=--name=value "
                                 "(e.g. --server-arg=--gpu-memory-utilization=0.93)")
            if arg.split("=", 1)[0] in SUITE_OWNED_FLAGS:
                raise SuiteError(f"--server-arg {arg!r}: the suite sets {arg.split('=', 1)[0]} itself (127.0.0.1, a free "
                                 "port, the model under test); drop it, and pick the model with --model")
        if server_url:
            _check_server_url(server_url)
        if server_args and server_url:
            raise SuiteError("--server-arg changes servers the suite boots; a --server-url server was started elsewhere")
        if (platform_option or device_option) and not server_url:
            raise SuiteError("--platform/--device describe a server started elsewhere: use them with --server-url "
                             "(a server the suite boots runs on this machine's platform)")
        platform = external_platform(platform_option, device_option) if server_url else detect_platform()
        flavour = catalog.flavour(flavour_option) if flavour_option else catalog.default_flavour(platform.name)
        rdir = _run_dir(run_dir)
        try:
            if server_url:
                model: Model | SuiteError = external_model(server_url, model_option)
            else:
                try:
                    model = resolve_model(model_option or default_alias(platform.name), rdir)
                except SuiteError as e:
                    if model_option:  # an explicit bad --model fails the run at once
                        raise
                    model = e  # the default model is only needed once a server boots (unit tests run without it)
                if isinstance(model, Model) and model_option and not Path(model.path).exists():
                    check_hub_model(model.path)  # not cached and no hub: one line now, not a dead server later
            suite = cls(catalog, platform, flavour, model, rdir, config_option, server_url, boot_timeout_s,
                        server_args=list(server_args or []), allow_unverified=allow_unverified,
                        run_dir_default=run_dir is None)
            if platform.name == UNKNOWN_PLATFORM and config_option is None:  # no platform to pick a default config by
                raise SuiteError("--server-url without --config: the server's platform is unknown, so no default config can "
                                 "be picked; pass --config=NAME (the config the server was started with) or --platform=...")
            suite.selected()  # validate --config now, at collection time
        except SuiteError:
            if run_dir is None:  # refused before anything ran there
                _drop_if_empty(rdir)
            raise
        return suite

    @property
    def model(self) -> Model:
        if isinstance(self.model_or_error, SuiteError):
            raise self.model_or_error
        return self.model_or_error

    def drop_run_dir_if_empty(self) -> None:
        """At the end of a run: the run dir the suite named itself goes when nothing was written there."""
        if self.run_dir_default:
            _drop_if_empty(self.run_dir)

    def selected(self) -> list[Config]:
        return self.catalog.select(self.config_option, self.platform.name)

    def engine_version(self) -> tuple[str, str | None]:
        """The engine and version under test: the external server's /version, else the installed vLLM."""
        if self.server_url:
            version = Client(self.server_url.rstrip("/"), "", timeout_s=10).version()
            return "vllm", None if version == "unknown" else version
        return installed_engine()

    def keyed_platform(self) -> Platform:
        """The platform goldens, baselines and tolerances are keyed by: this machine's, or --platform's."""
        if self.platform.name == UNKNOWN_PLATFORM:
            raise SuiteError("--server-url without --platform: the server's platform is unknown, so its goldens and "
                             "baselines cannot be chosen or written; pass --platform=sm_121 (and --device='NVIDIA GB10')")
        return self.platform

    def golden_folder(self) -> str:
        """The goldens' platform folder: the keyed platform's, or the flavour's own beside it (`sm_121-fork`) where its
        flavour file keeps its records apart."""
        return self.keyed_platform().name + self.flavour.records_suffix

    def record_refusal(self, server: "RunningServer", request) -> str | None:
        """Why this config's run may not write goldens or baselines (None: it may).

        Only runs whose kernel path is known good record: level 1.5 passed, and nothing in it (a missing required
        kernel, decode steps on the prefill backend) was merely excused by a logged fallback unless the flavour
        allows it (`allow_excused`). Without --allow-unverified, neither does a run level 1.5 cannot vouch for: a
        server the suite did not boot, or a config whose patterns no trace here confirmed (`unverified_refusal`)."""
        self.keyed_platform()
        if server.external:
            if self.allow_unverified:
                return None  # its goldens say "unchecked (external server)" in their metadata
            return (f"the suite did not boot this --server-url server and cannot profile it, so nothing shows it runs "
                    f"{server.target.name}'s kernels; drop --server-url to let the suite boot it, or pass --allow-unverified")
        kp = request.getfixturevalue("kernel_path")
        if not kp.verdict.ok:
            return f"its kernel path failed level 1.5 ({kp.verdict.problems[0]}); fix that first"
        spec = server.target.spec
        if kp.verdict.excused and not spec.kernels.allow_excused:
            return (f"its kernel path passed only by logged fallbacks' excuses ({'; '.join(kp.verdict.excused)}); "
                    "record from a run whose kernels all ran as configured, or set allow_excused for it in the flavour")
        return self.unverified_refusal(server.target.name, spec)

    def unverified_refusal(self, name: str, spec: ServerSpec) -> str | None:
        """Why a config whose level 1.5 passed still may not record (None: it may): its patterns for this platform come
        from public sources and no trace of it confirmed them, so the pass may be a guess that also matches a fallback,
        and the golden or baseline would bless whatever ran. --allow-unverified records anyway."""
        tags = spec.kernels.unverified
        if not tags or self.allow_unverified:
            return None
        undeclared = [t for t in tags if spec.kernels.verification[t].startswith(UNDECLARED)]
        unconfirmed = [t for t in tags if t not in undeclared]
        parts = ([f"its kernel patterns are not yet confirmed on a {self.platform.name} trace ({', '.join(unconfirmed)})"]
                 if unconfirmed else []) + ([f"no kernel declared for {', '.join(undeclared)} can show it took effect"]
                                            if undeclared else [])
        # record, review, then accept that trace: an --accept on the recording command would bless a trace unread
        fix = (f"confirm them first (python3 scripts/record_kernels.py --config={name} --sibling=OTHER, review its "
               "recording.md, then accept it with --from-summaries; docs/GB10.md)" if unconfirmed
               else "declare its kernels once a trace shows them")
        return f"{'; '.join(parts)}, so its level 1.5 pass does not show the configured kernels ran; {fix}, or pass " \
               "--allow-unverified"

    def kernel_path_note(self, server: "RunningServer") -> str:
        """What a golden recorded from this run says about its kernel path (its metadata's `kernel_path`)."""
        if server.external:
            return "unchecked (external server)"
        tags = server.target.spec.kernels.unverified if server.target.spec is not None else []
        if tags:
            return (f"level 1.5 passed without a {self.platform.name} trace confirming the patterns of {', '.join(tags)}")
        return "level 1.5 passed"

    def target(self, config: Config) -> Target:
        name = self.catalog.name(config)
        if self.platform.name == UNKNOWN_PLATFORM:  # an external server: only what needs no flavour data can run
            return Target(name, config, None, True, "")
        model = self.model_or_error if isinstance(self.model_or_error, Model) else None
        ok, reason = self.flavour.runnable(config, self.platform.name, model.path if model else None)
        if not ok:
            return Target(name, config, None, False, f"{reason} [platform {self.platform.name}]")
        spec = self.flavour.resolve(config, self.platform.name, model.args if model else {}, model.env if model else {})
        return Target(name, config, spec, True, "")

    def targets(self) -> list[Target]:
        return [self.target(c) for c in self.selected()]

    def boot(self, target: Target, tag: str = "", model_path: str | None = None,
             env_extra: dict[str, str] | None = None, args_extra: list[str] | None = None,
             beside_shared: bool = False) -> RunningServer:
        """Boot a server for `target`; use it as `with suite.boot(...) as running:` (stopped however the block ends).

        `model_path` swaps in another checkpoint of the same shape (the level 2 mutation checks);
        `env_extra` / `args_extra` perturb the server (the level 5 injected slowdown);
        `beside_shared` says the config's shared server is up at the same time."""
        if not target.runnable or target.spec is None:
            raise SuiteError(f"cannot boot {target.name}: {target.reason}")
        if beside_shared:
            ok, why = self.can_boot_secondary()
            if not ok:
                raise SuiteError(why)
            if self.platform.is_cuda:
                # the shared server holds its flavour's fraction (0.70) of GPU memory; the tiny model
                # needs little, and KV-cache size does not change batch-1 speed
                args_extra = list(args_extra or []) + ["--gpu-memory-utilization", str(SECONDARY_GPU_FRACTION)]
        key = f"{self.model.alias}__{target.name}{tag}"
        log = self.run_dir / "servers" / f"{key}.log"
        trace_dir = self.run_dir / "traces" / key
        # Profiling costs nothing until /start_profile, so every server can serve level 1.5 too.
        # --server-arg after the config's own (the last occurrence wins), before the suite's perturbations
        args = target.spec.args + self.server_args + list(args_extra or []) + profiler_args(trace_dir)
        # plugins/site on PYTHONPATH: the test-only vLLM hooks (no-ops unless SUITE_HOOK_* is set)
        env = {**hooks.server_env(hooks.hook_dir_of(self.run_dir, key)), **target.spec.env, **(env_extra or {})}
        proc = VllmServer(model_path or self.model.path, args, env, log, boot_timeout_s=self.boot_timeout_s)
        # tag "": the config's own server (the summary's boot column); others are checks' servers (mutations, ...)
        record = {"config": target.name, "tag": tag, "model": self.model.alias, "platform": self.platform.name,
                  "log": str(log)}
        if self.platform.is_cuda:  # which GPUs it got: under xdist each worker pins its own (harness.plugin.parallel)
            record["cuda_visible_devices"] = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
        # another run's server (a nightly job, a second checkout) on the same GPU or CPU cores: wait for it, saying so
        slot = ExitStack()
        slot.enter_context(machine_slot(server_gpus({**os.environ, **env}, args, self.platform.is_cuda),
                                        note=f"pid {os.getpid()} ({' '.join(sys.argv)[:120]}), server {key}, "
                                             f"run {self.run_dir}"))
        try:
            try:
                proc.start()
            except ServerDied as e:
                record.update(ok=False, error=str(e).splitlines()[0])
                self._record_boot(record)
                raise
            problem = hooks.random_weights_problem(env, args, log)
            if problem:
                proc.stop()
                record.update(ok=False, error=problem)
                self._record_boot(record)
                raise SuiteError(problem)
        except BaseException:
            slot.close()
            raise
        record.update(ok=True, boot_seconds=round(proc.boot_seconds, 1))
        self._record_boot(record)
        return RunningServer(proc.url, proc.served_name, target, log, proc, proc.boot_seconds, trace_dir, slot)

    def _record_boot(self, record: dict) -> None:
        """boots.json of the run; under xdist each worker writes its own file and the controller merges them.
        Locked: a server may boot on another thread while one is in use (harness.session.ahead)."""
        with _BOOTS_LOCK:
            self.boots.append(record)
            worker = os.environ.get("PYTEST_XDIST_WORKER")
            if worker:
                write_worker_boots(self.run_dir, worker, self.boots)
            else:
                (self.run_dir / "boots.json").write_text(json.dumps(self.boots, indent=2))

    def can_boot_secondary(self) -> tuple[bool, str]:
        """Whether a second server fits beside the shared one on this platform."""
        if self.platform.is_cuda and not self.model.has_real_weights:
            return False, (f"{self.model.alias} fills most of the GPU: a second server beside the shared one "
                           "does not fit (run this check with the tiny model)")
        return True, ""

    def external(self, target: Target) -> RunningServer:
        """The already-running server of --server-url (nothing is booted)."""
        return RunningServer(self.server_url.rstrip("/"), self.model.path, target)

    def artifact(self, *parts: str) -> Path:
        path = self.run_dir.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


# -- boot records: under xdist each worker writes its own file; the controller merges them ----------
def worker_boots_file(run_dir: Path, worker: str) -> Path:
    return Path(run_dir) / "boots" / f"{worker}.json"


def write_worker_boots(run_dir: Path, worker: str, boots: list[dict]) -> Path:
    path = worker_boots_file(run_dir, worker)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{**b, "worker": worker} for b in boots], indent=2))
    tmp.replace(path)
    return path


def merge_boots(run_dir: Path) -> list[dict]:
    """Every worker's boots, in boot order of each worker, written to `<run_dir>/boots.json`."""
    merged: list[dict] = []
    for path in sorted((Path(run_dir) / "boots").glob("*.json")):
        try:
            merged += json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            merged.append({"worker": path.stem, "ok": False, "error": f"unreadable {path.name}"})
    if merged:
        (Path(run_dir) / "boots.json").write_text(json.dumps(merged, indent=2))
    return merged


# The root conftest keeps the run's Suite here; level conftests read it with config.stash[SUITE_KEY].
SUITE_KEY = pytest.StashKey[Suite]()
