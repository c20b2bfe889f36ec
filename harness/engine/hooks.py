"""The harness side of the test-only vLLM plugin in `plugins/site/suite_testhooks` (memory hold, slowdown).

`server_env(dir)` is what every server the suite boots gets: `plugins/site` on its PYTHONPATH (vLLM
discovers the plugin through its dist-info entry point) and its own hook directory. The hooks stay no-ops
unless `SUITE_HOOK_HOLD_GIB` / `SUITE_HOOK_SLOWDOWN` are set, in the environment pytest runs in (then the
shared server gets them too) or in a test's `env_extra`. `set_slowdown` writes the control file and waits
for the server's acknowledgement; `plan_delay` turns a fraction of measured step times into a + b x tokens.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import SuiteError
from harness.core.paths import REPO

PLUGIN_SITE = REPO / "plugins" / "site"
HOLD_ENV = "SUITE_HOOK_HOLD_GIB"
SLOWDOWN_ENV = "SUITE_HOOK_SLOWDOWN"
DIR_ENV = "SUITE_HOOK_DIR"
ROUTES_ENV = "SUITE_HOOK_ROUTES"  # plugins/site/suite_testhooks/routes.py: per-layer expert counts to this file
RANDOM_MXFP4_ENV = "SUITE_HOOK_RANDOM_MXFP4"  # suite_testhooks/dummy_mxfp4.py: valid random weights under --load-format dummy
DECODE_LOGITS_ENV = "SUITE_HOOK_DECODE_LOGITS_SCALE"  # suite_testhooks/decode_logits.py: a decode-only fault
CONTROL_FILE = "slowdown.json"
DECODE_LOGITS_LOG = "suite_testhooks: decode-only logits scale"  # what decode_logits.py prints where it installs
RANDOM_MXFP4_LOG = "suite_testhooks: random MXFP4 codes"  # what dummy_mxfp4.py prints in every process it fills


KERNELS_ENV = "SUITE_KERNELS"  # plugins/site/suite_kernels: on with SUITE_KERNELS, tuned by SUITE_KERNELS_*


def stray_kernels_env(environ: dict[str, str], config_env: dict[str, str]) -> list[str]:
    """The kernels plugin's variables a server would inherit from the shell although its config does not turn the
    plugin on: left out, since the config names the kernels (a SUITE_KERNELS exported in a shell turned stock
    configs into the plugin's; SUITE_KERNELS_ROUTE / _MAX_M would retune a plugin config nobody asked to retune)."""
    if config_env.get(KERNELS_ENV, "").strip():
        return []
    return sorted(k for k in environ if k == KERNELS_ENV or k.startswith(KERNELS_ENV + "_"))


def _on(env: dict[str, str], name: str) -> bool:
    """A hook switch as the hooks read it (suite_testhooks)."""
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def random_weights_problem(env: dict[str, str], argv: list[str], log: Path) -> str | None:
    """Why a server asked for valid random weights (a shape model) may not be measured: the hook must have printed
    its line in the server log, or the model routes every token to the same experts while its records claim the
    hook's fingerprint. None: nothing asked for, not a dummy load, or the hook ran. The log is read only when asked."""
    if not _on(env, RANDOM_MXFP4_ENV):
        return None
    dummy = any(a == "--load-format=dummy" or (a == "--load-format" and i + 1 < len(argv) and argv[i + 1] == "dummy")
                for i, a in enumerate(argv))
    if not dummy or (log.is_file() and RANDOM_MXFP4_LOG in log.read_text(errors="replace")):
        return None
    return (f"{RANDOM_MXFP4_ENV}=1 asked for valid random weights but the server log has no '{RANDOM_MXFP4_LOG}' line: "
            f"the test hooks did not run (plugins/site must be on the server's PYTHONPATH; harness.engine.hooks."
            f"server_env puts it there), so the model would route every token to the same four experts")


def server_env(hook_dir: Path, base_env: dict[str, str] | None = None) -> dict[str, str]:
    """Env for a server: the plugin site appended to PYTHONPATH (keeping e.g. /tmp/vllm-site first)."""
    env = os.environ if base_env is None else base_env
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != PLUGIN_SITE]
    return {"PYTHONPATH": os.pathsep.join([*parts, str(PLUGIN_SITE)]), DIR_ENV: str(hook_dir)}


def hook_dir_of(run_dir: Path, server_key: str) -> Path:
    """Where `Suite.boot` puts a server's control file and acks (server_key = its log file's stem)."""
    return Path(run_dir) / "hooks" / server_key


def server_hook_dir(suite, server) -> Path | None:
    if server.log_path is None:
        return None
    return hook_dir_of(suite.run_dir, Path(server.log_path).stem)


def hooks_requested(env: dict[str, str] | None = None) -> dict[str, bool]:
    env = os.environ if env is None else env
    try:
        hold = float(env.get(HOLD_ENV, "0") or 0) > 0
    except ValueError:
        hold = False
    slow = _on(env, SLOWDOWN_ENV)
    return {"hold": hold, "slowdown": slow}


def read_acks(hook_dir: Path) -> list[dict]:
    out = []
    for p in sorted(Path(hook_dir).glob("ack-*.json")):
        try:
            out.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # being replaced right now: the next read sees it
    return out


def wait_for_ack(hook_dir: Path, what: str, timeout_s: float = 30.0, seq: int | None = None,
                 alive=None) -> dict:
    """The first ack that reports `what` ("hold" or "slowdown"; with `seq`, that control applied)."""
    deadline = time.monotonic() + timeout_s
    seen: list[dict] = []
    while time.monotonic() < deadline:
        if alive is not None:
            alive()
        seen = read_acks(hook_dir)
        for a in seen:
            if a.get("errors"):
                raise SuiteError(f"suite_testhooks in pid {a.get('pid')} reported: {'; '.join(a['errors'])}")
            item = a.get(what)
            if item and (seq is None or item.get("seq") == seq):
                return a
        time.sleep(0.05)
    raise SuiteError(f"no suite_testhooks acknowledgement of {what}{f' seq {seq}' if seq is not None else ''} in "
                     f"{hook_dir} after {timeout_s:.0f} s (acks: {seen}); is plugins/site on the server's "
                     f"PYTHONPATH and {HOLD_ENV if what == 'hold' else SLOWDOWN_ENV} set?")


@dataclass(frozen=True)
class Delay:
    """Per forward pass: a_us + b_us_per_token x tokens-in-batch."""

    a_us: float
    b_us_per_token: float

    def at(self, tokens: int) -> float:
        return self.a_us + self.b_us_per_token * tokens


def plan_delay(fraction: float, decode_step_s: float, prefill_tokens: int, prefill_s: float) -> Delay:
    """The a + b x tokens that adds `fraction` of the measured step time to a decode step (1 token) and
    to a prefill of `prefill_tokens` (one forward pass, as with chunked prefill off or N <= the chunk).

    Solves a + b = f x t_decode and a + b x N = f x t_prefill; b is clamped at 0 (never negative)."""
    if fraction < 0 or decode_step_s <= 0 or prefill_s <= 0 or prefill_tokens < 2:
        raise SuiteError(f"plan_delay needs fraction >= 0, step times > 0 and >= 2 prefill tokens (got {fraction}, "
                         f"{decode_step_s}, {prefill_tokens}, {prefill_s})")
    b = max(0.0, fraction * (prefill_s - decode_step_s) / (prefill_tokens - 1))
    a = max(0.0, fraction * decode_step_s - b)
    return Delay(a * 1e6, b * 1e6)


def set_slowdown(hook_dir: Path, delay: Delay, timeout_s: float = 30.0, alive=None) -> dict:
    """Write the control file (atomically) and wait until the server acknowledges this exact setting."""
    hook_dir = Path(hook_dir)
    hook_dir.mkdir(parents=True, exist_ok=True)
    path = hook_dir / CONTROL_FILE
    prev = {}
    try:
        prev = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    seq = int(prev.get("seq") or 0) + 1
    body = {"seq": seq, "a_us": delay.a_us, "b_us_per_token": delay.b_us_per_token, "written_at": time.time()}
    fd, tmp = tempfile.mkstemp(dir=hook_dir, prefix=".slowdown.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(body, f)
    os.replace(tmp, path)
    return wait_for_ack(hook_dir, "slowdown", timeout_s, seq=seq, alive=alive)
