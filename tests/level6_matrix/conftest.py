"""Level 6 plumbing: the plan of combinations, and one dedicated server per combination.

Each combination boots once (suite.boot, always stopped), and while it is up the suite records its
evidence: a smoke completion, a profiled kernel path (level 1.5) and a short level 2 run. Tests then
judge that evidence, so a combination's tests and the orthogonality pairs that need it share one boot.

Parallel runs (pytest-xdist, `-n N`): each worker boots its own servers. Workers share evidence through
files in a directory keyed by xdist's test-run id, so a combination is booted by one worker only (a
lock per combination), and at most one server runs per slot, the slots every level's servers share
(harness/parallel.py `server_slot`): on CPU one slot (the cores are shared, so servers take turns whatever
`-n` says), on CUDA one per visible GPU, each worker pinned to its GPU by the root conftest before it
boots anything. Without xdist (`-n 0` or no `-n`) evidence lives in memory.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from harness.correctness import check_golden_data, load_workload, run_level2, score
from harness.errors import SuiteError
from harness.filelock import FileLock
from harness.matrix import Plan, load_matrix, make_plan, pair_id
from harness.suite import SUITE_KEY, Suite

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKLOAD = HERE / "workload.yaml"
SMOKE_PROMPT = "def fibonacci(n):\n    "
SMOKE_TOKENS = 16
NO_PLAN = "no-plan"


def _root_suite(config: pytest.Config) -> Suite:
    """The Suite the root conftest created."""
    if SUITE_KEY not in config.stash:
        raise SuiteError("level 6: the root conftest's Suite is not in the pytest stash; run pytest from the repository root")
    return config.stash[SUITE_KEY]


def _plan(config: pytest.Config) -> Plan | SuiteError:
    """The platform's plan, computed once per process (collection and fixtures share it)."""
    cached = getattr(config, "_level6_plan", None)
    if cached is not None:
        return cached
    try:
        suite = _root_suite(config)
        data = load_matrix()
        spec = data.for_platform(suite.platform.name)
        if spec is None:
            raise SuiteError(f"no level 6 matrix for platform {suite.platform.name} in {data.path}; add one under `platforms:`")
        model = getattr(suite.model_or_error, "path", None)
        plan: Plan | SuiteError = make_plan(suite.catalog, suite.flavour, suite.platform.name, spec, model)
    except SuiteError as e:
        plan = e
    config._level6_plan = plan
    return plan


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    wanted = [f for f in ("combo", "variant", "pair") if f in metafunc.fixturenames]
    if not wanted:
        return
    plan = _plan(metafunc.config)
    if isinstance(plan, SuiteError):
        ids = [NO_PLAN]  # the fixture raises the plan's error, so the run shows why
    elif wanted[0] == "combo":
        ids = plan.names()
    elif wanted[0] == "variant":
        ids = plan.names()[1:]
    else:
        ids = [pair_id(a.name, b.name) for a, b, _ in plan.pairs()]
    metafunc.parametrize(wanted[0], ids, ids=ids)


# -- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def plan(request: pytest.FixtureRequest, suite: Suite) -> Plan:
    p = _plan(request.config)
    if isinstance(p, SuiteError):
        raise p
    return p


@pytest.fixture(scope="session")
def level6_dir(request: pytest.FixtureRequest, suite: Suite) -> Path:
    """Reports, and under xdist the evidence workers share (keyed by the run's id, never reused).

    xdist workers share the controller's run dir (harness.parallel hands it to them)."""
    path = suite.run_dir / "level6"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def workload():
    """The short level 2 workload, or the SuiteError explaining why it cannot load (e.g. no heldout text)."""
    try:
        return load_workload(WORKLOAD)
    except SuiteError as e:
        return e


class Runner:
    """Boots each combination once and records its evidence (see the module docstring)."""

    def __init__(self, suite: Suite, plan: Plan, shared: Path, workload, config: pytest.Config,
                 force_regen: bool = False) -> None:
        self.suite, self.plan, self.workload, self.config = suite, plan, workload, config
        self.memory: dict[str, dict] = {}
        self.smoke_tokens = SMOKE_TOKENS
        self.xdist = os.environ.get("PYTEST_XDIST_WORKER")
        self.shared = shared / f"evidence-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'local')}"
        # the root conftest pinned this worker to its GPU (harness/parallel.py); servers inherit it
        self.slot = f"gpu{os.environ['CUDA_VISIBLE_DEVICES']}" if suite.platform.is_cuda and os.environ.get("CUDA_VISIBLE_DEVICES") else (
            "gpu-all" if suite.platform.is_cuda else "cpu")
        self.force_regen = force_regen

    def evidence(self, name: str) -> dict:
        if name in self.memory:
            return self.memory[name]
        if not self.xdist:
            self.memory[name] = self._run(name)
            return self.memory[name]
        path = self.shared / f"{name}.json"
        per_boot = self.suite.boot_timeout_s + 900
        with FileLock(self.shared / f"{name}.lock", per_boot, f"level 6 lock of {name}"):
            if not path.is_file():
                from harness import parallel

                # the same server slots every level uses: one server per GPU, one at a time on CPU
                with parallel.server_slot(self.suite.run_dir, self.xdist, parallel.all_gpus(self.config), 1,
                                          self.suite.platform.is_cuda, timeout_s=per_boot * len(self.plan.combos)):
                    ev = self._run(name)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(ev))
                tmp.replace(path)
            self.memory[name] = json.loads(path.read_text())
        return self.memory[name]

    def stage(self, name: str, stage: str) -> dict:
        """A combination's evidence holding `stage`, or a failure that says why there is none."""
        ev = self.evidence(name)
        for failed in ("boot", stage):
            if failed in ev["errors"]:
                raise SuiteError(f"{name}: {failed} failed: {ev['errors'][failed]}")
        if stage not in ev:
            raise SuiteError(f"{name}: no {stage} evidence recorded (see {ev.get('log')})")
        return ev

    def golden(self, name: str) -> dict | None:
        """A combination's stored level 6 golden (validated); None when absent or under --force-regen."""
        if self.force_regen or not self.store(name).path("level6").is_file():
            return None
        return self.store(name).load("level6", "level6", self.check_golden)

    def check_golden(self, data: object, where: str) -> dict:
        """check_golden_data with this workload's prompts: one stream and one scoring per prompt."""
        return check_golden_data(data, where, prompts=self.workload.prompts)

    def store(self, name: str):
        from harness.goldens import GoldenStore

        platform = self.suite.keyed_platform()
        meta = {"model": self.suite.model.alias, "config": name, "platform": platform.name, "device": platform.device,
                "flavour": self.suite.flavour.name, "workload": str(WORKLOAD.relative_to(REPO))}
        return GoldenStore(self.suite.model.alias, platform.name, name, meta, self.force_regen, lambda: self.refusal(name),
                           model_fingerprint=self.suite.model.fingerprint)

    def refusal(self, name: str) -> str | None:
        kp = self.stage(name, "kernel_path")["kernel_path"]
        if not kp["ok"]:
            return f"its kernel path failed ({kp['problems'][0]})"
        target = self.suite.target(self.plan.combo(name).config)
        if kp["excused"] and not target.spec.kernels.allow_excused:
            return f"its kernel path passed only by logged fallbacks' excuses ({'; '.join(kp['excused'])})"
        return None

    def _level2(self, client, name: str) -> dict:
        """Streams and scorings of the combination's own golden's sequences (its own under --force-regen), and,
        for a neutral variant, scorings of the base's golden's sequences too (no interference check)."""
        result = run_level2(client, self.workload, self.golden(name))
        out = {"streams": {k: s.to_json() for k, s in result.streams.items()},
               "scored": {k: s.to_json() for k, s in result.scored.items()}, "reference": result.reference}
        combo = self.plan.combo(name)
        if name != self.plan.base.name and set(combo.differs) <= set(self.plan.neutral):
            base = self.golden(self.plan.base.name)
            if base is not None:
                out["scored_base"] = {k: score(client, list(v["ids"]), self.workload.top_k).to_json()
                                      for k, v in base["scored"].items()}
        return out

    def _run(self, name: str) -> dict:
        from harness.kernel_path import profile_kernel_path

        combo = self.plan.combo(name)
        target = self.suite.target(combo.config)
        ev: dict = {"name": name, "slot": self.slot, "worker": self.xdist or "main", "errors": {}}
        started = time.monotonic()
        try:
            running = self.suite.boot(target, tag="__level6")
        except SuiteError as e:
            ev["errors"]["boot"] = str(e)
            return ev
        try:
            ev.update(boot_seconds=round(running.boot_seconds, 1), log=str(running.log_path))
            client = running.client()
            ev["vllm"] = client.version()
            stages = {
                "smoke": lambda: client.complete(SMOKE_PROMPT, SMOKE_TOKENS, logprobs=1, ignore_eos=True),
                "kernel_path": lambda: _path_evidence(profile_kernel_path(self.suite, running)),
            }
            if not isinstance(self.workload, SuiteError) and self.suite.model.has_real_weights:
                stages["level2"] = lambda: self._level2(client, name)
            for stage, fn in stages.items():
                try:
                    running.ensure_alive()
                    ev[stage] = fn()
                except SuiteError as e:
                    ev["errors"][stage] = str(e)
                except Exception as e:  # recorded, so the combination is not booted again by the next test
                    ev["errors"][stage] = f"{type(e).__name__}: {e}"
            ev["alive_at_end"] = running.process.alive()
        finally:
            running.process.stop()
        ev["seconds"] = round(time.monotonic() - started, 1)
        return ev


def _path_evidence(kp) -> dict:
    return {"summary": kp.summary.to_json(), "ok": kp.verdict.ok, "problems": kp.verdict.problems,
            "excused": kp.verdict.excused, "artifact": str(kp.artifact)}


@pytest.fixture(scope="session")
def runner(request: pytest.FixtureRequest, suite: Suite, plan: Plan, level6_dir: Path, workload) -> Runner:
    if suite.server_url:
        pytest.skip("--server-url: level 6 boots a server per combination, which an external server cannot be")
    return Runner(suite, plan, level6_dir, workload, request.config, bool(request.config.getoption("force_regen", False)))
