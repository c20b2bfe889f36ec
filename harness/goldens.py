"""Golden files: what a correct run produced, as data, keyed by model, platform and config.

Files live at `goldens/<model>/<platform>/<config>/<kind>.json` with metadata (vLLM version, device,
date, and the kernel-path verdict of the run that wrote it). Semantics follow pytest-regressions: a
missing golden fails with the command that creates it; `--force-regen` rewrites it and fails so a
regenerated file is never mistaken for a passing check. What is compared, and how, is in
harness/logprobs.py (rules) and harness/correctness.py (the workload).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.errors import SuiteError

REPO = Path(__file__).resolve().parent.parent
GOLDEN_ROOT = REPO / "goldens"
SCHEMA = 2  # 2: teacher-forced scorings (`scored`) and prompt ids in every stream


class Regenerated(SuiteError):
    """--force-regen wrote a golden or baseline: the test fails so it is never mistaken for a pass."""


def _shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def golden_path(model: str, platform: str, config: str, kind: str, root: Path = GOLDEN_ROOT) -> Path:
    return root / model / platform / config / f"{kind}.json"


def regen_command(level: str, config: str, model: str) -> str:
    return f"pytest -m {level} --config={config} --model={model} --force-regen"


def load_golden(path: Path, regen_cmd: str) -> dict:
    if not path.is_file():
        raise SuiteError(f"no golden at {_shown(path)}; create it with: {regen_cmd}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SuiteError(f"golden {path} is corrupt ({e}); restore it from git or regenerate: {regen_cmd}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or "meta" not in data or "data" not in data:
        raise SuiteError(f"golden {path} lacks schema {SCHEMA} / meta / data; restore it from git or regenerate: {regen_cmd}")
    return data


def save_golden(path: Path, data: Any, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.write_text(_dumps({"schema": SCHEMA, "meta": meta, "data": data}) + "\n", encoding="utf-8")


def _dumps(obj: Any, depth: int = 0, open_levels: int = 3) -> str:
    """JSON with the first `open_levels` levels of mappings indented and everything deeper on one line:
    a golden's streams and scorings are long lists, and a line per number would bury a diff."""
    if not isinstance(obj, dict) or depth >= open_levels or not obj:
        return json.dumps(obj, separators=(",", ":"))
    pad = " " * (depth + 1)
    items = [f"{pad}{json.dumps(str(k))}: {_dumps(v, depth + 1, open_levels)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"


class GoldenStore:
    """One config's goldens for a run: `load` them for comparison, `save` them under --force-regen.

    `regen_refusal()` says why this run may not write goldens (its kernel path failed or had a missing
    kernel excused, or the platform of an external server is unknown); None when it may.
    """

    def __init__(self, model: str, platform: str, config: str, meta: dict, force_regen: bool,
                 regen_refusal=lambda: None, root: Path = GOLDEN_ROOT, model_fingerprint: str | None = None) -> None:
        self.model, self.platform, self.config, self.model_fingerprint = model, platform, config, model_fingerprint
        if model_fingerprint:
            meta = {**meta, "model_fingerprint": model_fingerprint}
        self.meta, self.force_regen, self.regen_refusal, self.root = meta, force_regen, regen_refusal, root

    def path(self, kind: str) -> Path:
        return golden_path(self.model, self.platform, self.config, kind, self.root)

    def load(self, kind: str, level: str, check=None) -> dict | None:
        """The stored data (validated by `check(data, where)`), or None under --force-regen."""
        if self.force_regen:
            return None
        path = self.path(kind)
        cmd = regen_command(level, self.config, self.model)
        golden = load_golden(path, cmd)
        recorded = golden["meta"].get("model_fingerprint")
        if self.model_fingerprint and recorded != self.model_fingerprint:
            raise SuiteError(f"golden {_shown(path)} was recorded with other weights of {self.model} "
                             f"(fingerprint {recorded or 'not recorded'}, this run: {self.model_fingerprint}); "
                             f"regenerate it: {cmd}")
        data = golden["data"]
        return check(data, f"golden {_shown(path)}") if check else data

    def save(self, kind: str, fresh: Any, extra_meta: dict | None = None) -> None:
        """Write `fresh` and raise Regenerated; refuse (SuiteError) when the run may not record goldens."""
        why = self.regen_refusal()
        if why:
            raise SuiteError(f"--force-regen refused for {self.config}: {why}")
        path = self.path(kind)
        save_golden(path, fresh, {**self.meta, **(extra_meta or {})})
        raise Regenerated(f"--force-regen: wrote {_shown(path)}; re-run without --force-regen to check against it")
