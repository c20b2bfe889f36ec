"""Golden files: what a correct run produced, as data, keyed by model, platform and config.

Files live at `goldens/<model>/<platform>/<config>/<kind>.json` with metadata (vLLM version, device, flavour,
date, and the kernel-path verdict of the run that wrote it). Reading, refusing and recording follow the one
record/compare store of harness.core.store (pytest-regressions' semantics, obtained copies in the run dir).
What is compared, and how, is in harness/correctness/logprobs.py (rules) and harness/correctness/level2.py
(the workload).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

from harness.core.errors import SuiteError
from harness.core.paths import GOLDEN_ROOT, shown
from harness.core.store import Store, regen_command
SCHEMA = 2  # 2: teacher-forced scorings (`scored`) and prompt ids in every stream


LEVEL2_KINDS = ("level2", "chat", "tasks")  # the goldens level 2's tests load (tests/level2_correctness)


def golden_path(model: str, platform: str, config: str, kind: str, root: Path = GOLDEN_ROOT) -> Path:
    return root / model / platform / config / f"{kind}.json"


def recorded_kinds(model: str, platform: str, config: str, kinds: tuple[str, ...] = LEVEL2_KINDS,
                   root: Path = GOLDEN_ROOT) -> list[str]:
    """Which of `kinds` have a golden file for this model, platform folder and config."""
    return [k for k in kinds if golden_path(model, platform, config, k, root).is_file()]


def _unique_keys(pairs: list) -> dict:
    """json's object hook: a repeated key is an error (json keeps the last one in silence, as a hand edit might)."""
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def load_golden(path: Path, regen_cmd: str) -> dict:
    if not path.is_file():
        raise SuiteError(f"no golden at {shown(path)}; create it with: {regen_cmd}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, or a repeated key
        raise SuiteError(f"golden {path} is corrupt ({e}); restore it from git or regenerate: {regen_cmd}") from None
    except OSError as e:
        raise SuiteError(f"golden {path} cannot be read ({type(e).__name__}: {e.strerror}); fix its permissions, restore "
                         f"it from git or regenerate: {regen_cmd}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("meta"), dict) \
            or "data" not in data:
        raise SuiteError(f"golden {path} lacks schema {SCHEMA} / meta / data; restore it from git or regenerate: {regen_cmd}")
    return data


def golden_text(data: Any, meta: dict) -> str:
    meta = {**meta, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return _dumps({"schema": SCHEMA, "meta": meta, "data": data}) + "\n"


def _dumps(obj: Any, depth: int = 0, open_levels: int = 3) -> str:
    """JSON with the first `open_levels` levels of mappings indented and everything deeper on one line:
    a golden's streams and scorings are long lists, and a line per number would bury a diff."""
    if not isinstance(obj, dict) or depth >= open_levels or not obj:
        return json.dumps(obj, separators=(",", ":"))
    pad = " " * (depth + 1)
    items = [f"{pad}{json.dumps(str(k))}: {_dumps(v, depth + 1, open_levels)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"


class GoldenStore:
    """One config's goldens for a run: `load` them for comparison; `settle` keeps the fresh result in the run
    directory and, under --force-regen, records it (harness.core.store).

    `regen_refusal()` says why this run may not write goldens (its kernel path failed or had a missing
    kernel excused, or the platform of an external server is unknown); None when it may. A golden recorded with
    other weights (`model_fingerprint`) or under another flavour (`meta["flavour"]`) is refused by name.
    """

    def __init__(self, model: str, platform: str, config: str, meta: dict, force_regen: bool,
                 regen_refusal: Callable[[], str | None] = lambda: None, root: Path = GOLDEN_ROOT,
                 model_fingerprint: str | None = None, run_dir: Path | None = None, folder: str | None = None) -> None:
        self.model, self.platform, self.config, self.model_fingerprint = model, platform, config, model_fingerprint
        # the platform's folder, or the flavour's own beside it (Flavour.records_suffix: `sm_121-fork`)
        self.folder = folder or platform
        if model_fingerprint:
            meta = {**meta, "model_fingerprint": model_fingerprint}
        self.meta, self.force_regen, self.root = meta, force_regen, root
        self.store = Store(run_dir, force_regen, regen_refusal,
                           {"model_fingerprint": model_fingerprint, "flavour": meta.get("flavour")})

    def path(self, kind: str) -> Path:
        return golden_path(self.model, self.folder, self.config, kind, self.root)

    def load(self, kind: str, level: str, check=None) -> dict | None:
        """The stored data (validated by `check(data, where)`), or None under --force-regen."""
        if self.force_regen:
            return None
        path = self.path(kind)
        cmd = regen_command(level, self.config, self.model)
        golden = load_golden(path, cmd)
        meta = golden["meta"] if isinstance(golden.get("meta"), dict) else {}
        # config: this store's config is the --goldens-of target where given, and --force-regen refuses that option,
        # so a golden's own meta always names its folder's config
        for key, here in (("model", self.model), ("platform", self.platform), ("config", self.config)):
            # a file copied into another folder: real checkpoints have no fingerprint to tell them apart
            if meta.get(key) and meta[key] != here:
                raise SuiteError(f"golden {shown(path)} was recorded for {key} {meta[key]}, this run's is {here}: it is "
                                 f"in another {key}'s folder; move it back, or regenerate it: {cmd}")
        recorded_args, run_args = meta.get("server_args") or [], self.meta.get("server_args") or []
        if recorded_args and recorded_args != run_args:
            raise SuiteError(f"golden {shown(path)} was recorded with --server-arg {' '.join(recorded_args)} (this run: "
                             f"{' '.join(run_args) or 'none'}): it is not {self.config}'s own; regenerate it without them: {cmd}")
        self.store.check(golden["meta"], f"golden {shown(path)}", self.model, f"regenerate it: {cmd}")
        data = golden["data"]
        return check(data, f"golden {shown(path)}") if check else data

    def save(self, kind: str, fresh: Any, extra_meta: dict | None = None) -> NoReturn:
        """Write `fresh` and raise Regenerated; refuse (SuiteError) when the run may not record goldens."""
        text = golden_text(fresh, {**self.meta, **(extra_meta or {})})
        self.store.record(self.path(kind), text, self.config,
                          "wrote {path}; re-run without --force-regen to check against it")

    def settle(self, kind: str, stored: dict | None, fresh: Any, extra_meta: dict | None = None) -> dict:
        """The golden to compare `fresh` with: `stored` (from `load`), after keeping `fresh` in the run directory;
        under --force-regen (`stored` is None) `fresh` is recorded and the test fails (Regenerated)."""
        meta = {**self.meta, **(extra_meta or {})}
        if stored is not None and "kernel_path" in meta:
            # a comparison run never asked whether it may record: its copy must not read as a checked golden
            meta["kernel_path"] = "not checked (a comparison run's copy; --force-regen records a checked golden)"
        # under --goldens-of this store reads another config's golden; the fresh copy is the running config's own
        own = golden_path(self.model, self.folder, self.meta.get("config") or self.config, kind, self.root)
        self.store.obtained(own, golden_text(fresh, meta))
        if stored is None:
            self.save(kind, fresh, extra_meta)
        return stored
