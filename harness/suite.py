"""What one pytest run is about: platform, flavour, model, selected configs, run directory, servers."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.client import Client
from harness.configs import Catalog, Config, Flavour, ServerSpec
from harness.errors import SuiteError
from harness.models import REPO, Model, default_alias, resolve_model
from harness.platform import Platform, detect_platform
from harness.server import ServerDied, VllmServer
from harness.traces import profiler_args

SECONDARY_GPU_FRACTION = 0.2


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

    @property
    def external(self) -> bool:
        return self.process is None

    def ensure_alive(self) -> None:
        if self.process is not None:
            self.process.ensure_alive()

    def client(self, timeout_s: float = 300.0) -> Client:
        return Client(self.url, self.served_name, timeout_s=timeout_s, alive=self.ensure_alive)

    def log_text(self) -> str:
        if self.log_path is None:
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")


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

    @classmethod
    def create(
        cls, config_option: str | None, model_option: str | None, flavour_option: str | None,
        server_url: str | None, run_dir: str | None, boot_timeout_s: float,
    ) -> "Suite":
        catalog = Catalog()
        platform = detect_platform()
        flavour = catalog.flavour(flavour_option) if flavour_option else catalog.default_flavour(platform.name)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        rdir = Path(run_dir) if run_dir else REPO / "runs" / stamp
        rdir.mkdir(parents=True, exist_ok=True)
        try:
            model: Model | SuiteError = resolve_model(model_option or default_alias(platform.name), rdir)
        except SuiteError as e:
            if model_option:  # an explicit bad --model fails the run at once
                raise
            model = e  # the default model is only needed once a server boots (unit tests run without it)
        suite = cls(catalog, platform, flavour, model, rdir, config_option, server_url, boot_timeout_s)
        suite.selected()  # validate --config now, at collection time
        return suite

    @property
    def model(self) -> Model:
        if isinstance(self.model_or_error, SuiteError):
            raise self.model_or_error
        return self.model_or_error

    def selected(self) -> list[Config]:
        return self.catalog.select(self.config_option, self.platform.name)

    def target(self, config: Config) -> Target:
        name = self.catalog.name(config)
        model = self.model_or_error if isinstance(self.model_or_error, Model) else None
        ok, reason = self.flavour.runnable(config, self.platform.name, model.path if model else None)
        if not ok:
            return Target(name, config, None, False, f"{reason} [platform {self.platform.name}]")
        return Target(name, config, self.flavour.resolve(config, self.platform.name, model.args if model else {}), True, "")

    def targets(self) -> list[Target]:
        return [self.target(c) for c in self.selected()]

    def boot(self, target: Target, tag: str = "", model_path: str | None = None,
             env_extra: dict[str, str] | None = None, args_extra: list[str] | None = None,
             beside_shared: bool = False) -> RunningServer:
        """Boot a server for `target` (the caller must `stop()` its process).

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
        args = target.spec.args + list(args_extra or []) + profiler_args(trace_dir)
        env = {**target.spec.env, **(env_extra or {})}
        proc = VllmServer(model_path or self.model.path, args, env, log, boot_timeout_s=self.boot_timeout_s)
        record = {"config": target.name, "model": self.model.alias, "platform": self.platform.name, "log": str(log)}
        try:
            proc.start()
        except ServerDied as e:
            record.update(ok=False, error=str(e).splitlines()[0])
            self.boots.append(record)
            raise
        record.update(ok=True, boot_seconds=round(proc.boot_seconds, 1))
        self.boots.append(record)
        (self.run_dir / "boots.json").write_text(json.dumps(self.boots, indent=2))
        return RunningServer(proc.url, proc.served_name, target, log, proc, proc.boot_seconds, trace_dir)

    def can_boot_secondary(self) -> tuple[bool, str]:
        """Whether a second server fits beside the shared one on this platform."""
        if self.platform.is_cuda and not self.model.has_real_weights:
            return False, (f"{self.model.alias} fills most of the GPU: a second server beside the shared one "
                           "does not fit (run this check with the tiny model)")
        return True, ""

    def external(self, target: Target) -> RunningServer:
        """The already-running server of --server-url (nothing is booted)."""
        url = self.server_url.rstrip("/")
        probe = Client(url, "", timeout_s=30)
        try:
            names = probe.models()
        except SuiteError as e:
            raise SuiteError(f"--server-url {url}: cannot list models ({e}); is the server up?") from None
        if not names:
            raise SuiteError(f"--server-url {url}: /v1/models lists no model")
        return RunningServer(url, names[0], target)

    def artifact(self, *parts: str) -> Path:
        path = self.run_dir.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path



# The root conftest keeps the run's Suite here; level conftests read it with config.stash[SUITE_KEY].
SUITE_KEY = pytest.StashKey[Suite]()
