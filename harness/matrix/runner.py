"""Level 6 evidence: each combination booted once (suite.boot, always stopped), and while it is up its smoke
completion, profiled kernel path (level 1.5) and short level 2 run recorded; tests/level6_matrix/ judges them.

Parallel runs (pytest-xdist, `-n N`): each worker boots its own servers. Workers share evidence through
files in a directory keyed by xdist's test-run id, so a combination is booted by one worker only (a
lock per combination), and at most one server runs per slot, the slots every level's servers share.
Without xdist (`-n 0` or no `-n`) evidence lives in memory.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, ContextManager

from harness.core.errors import SuiteError
from harness.core.filelock import FileLock
from harness.core.paths import REPO, TESTS_DIR
from harness.correctness.goldens import GoldenStore
from harness.correctness.level2 import check_golden_data, run_level2, score
from harness.kernelpath.check import profile_kernel_path
from harness.matrix.combinations import Plan
from harness.session.ahead import BootAhead, ahead_allowed
from harness.session.suite import RunningServer, Suite

WORKLOAD = TESTS_DIR / "level6_matrix" / "workload.yaml"
SMOKE_PROMPT = "def fibonacci(n):\n    "
SMOKE_TOKENS = 16


class Runner:
    """Boots each combination once and records its evidence (see the module docstring)."""

    def __init__(self, suite: Suite, plan: Plan, shared: Path, workload, slot: Callable[[float], ContextManager],
                 force_regen: bool = False) -> None:
        """`slot(timeout_s)`: holds the server slot every level's servers share while one combination runs
        (harness.plugin.parallel.server_slot, given by the level 6 conftest)."""
        self.suite, self.plan, self.workload, self.slot_of = suite, plan, workload, slot
        self.memory: dict[str, dict] = {}
        self.smoke_tokens = SMOKE_TOKENS
        self.xdist = os.environ.get("PYTEST_XDIST_WORKER")
        self.shared = shared / f"evidence-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'local')}"
        # the root conftest pinned this worker to its GPU (harness/plugin/parallel.py); servers inherit it
        self.slot = f"gpu{os.environ['CUDA_VISIBLE_DEVICES']}" if suite.platform.is_cuda and os.environ.get("CUDA_VISIBLE_DEVICES") else (
            "gpu-all" if suite.platform.is_cuda else "cpu")
        self.force_regen = force_regen
        # the next combination boots while this one's checks run (CPU, no xdist): nothing here is timed
        self.ahead = BootAhead(plan.names(), self._boot, suite.boot_timeout_s + 60, ahead_allowed(suite))

    def _boot(self, name: str) -> RunningServer:
        return self.suite.boot(self.suite.target(self.plan.combo(name).config), tag="__level6")

    def close(self) -> None:
        self.ahead.close()

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
                # the same server slots every level uses: one server per GPU, one at a time on CPU
                with self.slot_of(per_boot * len(self.plan.combos)):
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

    def store(self, name: str) -> GoldenStore:
        platform = self.suite.keyed_platform()
        meta = {"model": self.suite.model.alias, "config": name, "platform": platform.name, "device": platform.device,
                "flavour": self.suite.flavour.name, "workload": str(WORKLOAD.relative_to(REPO))}
        return GoldenStore(self.suite.model.alias, platform.name, name, meta, self.force_regen, lambda: self.refusal(name),
                           model_fingerprint=self.suite.model.fingerprint, run_dir=self.suite.run_dir,
                           folder=self.suite.golden_folder())

    def refusal(self, name: str) -> str | None:
        kp = self.stage(name, "kernel_path")["kernel_path"]
        if not kp["ok"]:
            return f"its kernel path failed ({kp['problems'][0]})"
        target = self.suite.target(self.plan.combo(name).config)
        if kp["excused"] and not target.spec.kernels.allow_excused:
            return f"its kernel path passed only by logged fallbacks' excuses ({'; '.join(kp['excused'])})"
        return self.suite.unverified_refusal(name, target.spec)

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
        ev: dict = {"name": name, "slot": self.slot, "worker": self.xdist or "main", "errors": {}}
        started = time.monotonic()
        try:
            running = self.ahead.take(name)
        except SuiteError as e:
            ev["errors"]["boot"] = str(e)
            return ev
        with running:
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
        ev["seconds"] = round(time.monotonic() - started, 1)
        return ev


def _path_evidence(kp) -> dict:
    return {"summary": kp.summary.to_json(), "ok": kp.verdict.ok, "problems": kp.verdict.problems,
            "excused": kp.verdict.excused, "artifact": str(kp.artifact)}
