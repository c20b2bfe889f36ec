"""Per-architecture launch configs from tuning.yaml, with file and environment overrides."""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

import torch
import yaml

DEFAULT_FILE = Path(__file__).with_name("tuning.yaml")


def current_arch() -> str:
    """'sm_90', 'sm_121', ... for the current CUDA device; 'cpu' when kernels run in the interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read tuning file {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"tuning file {path} must map arch names to kernel configs")
    return data


def verified(arch: str) -> bool | None:
    """Whether a run on `arch` validated its tuning.yaml entries: its own section's `verified`, else its
    family's (sm_12x for sm_121), else None (the file says nothing for it)."""
    data = _load(str(DEFAULT_FILE))
    family = arch[:-1] + "x" if arch.startswith("sm_") and len(arch) >= 5 else None
    for key in (arch, family):
        if key and isinstance(data.get(key), dict) and "verified" in data[key]:
            return bool(data[key]["verified"])
    return None


def _parse_env(value: str) -> Any:
    """'64' -> 64, '128,64' -> [128, 64], 'dot_scaled' -> 'dot_scaled'."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    conv = []
    for p in parts:
        try:
            conv.append(int(p))
        except ValueError:
            try:
                conv.append(float(p))
            except ValueError:
                conv.append(p)
    return conv if len(conv) != 1 or "," in value else conv[0]


def get_config(kernel: str, arch: str | None = None) -> dict[str, Any]:
    """Merged config of one kernel ('gemv', 'moe', 'quant') for `arch` (default: current device).

    Cached per (kernel, arch, relevant environment): launches call this on the hot path.
    """
    prefix = f"KERNELS_{kernel.upper()}_"
    env = tuple((k, v) for k, v in _kernels_env() if k.startswith(prefix) or k == "KERNELS_TUNING")
    return _copy(_get_config(kernel, arch or current_arch(), env))


def _kernels_env() -> list[tuple[str, str]]:
    """The KERNELS_* variables, sorted. The served model's eager ops (the lm_head) look their config up on every
    decode step: decoding every variable of os.environ cost ~27 us there and a deepcopy ~17 us (CPU, 35 variables),
    so this filters os.environ's undecoded store (POSIX) first."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):  # CPython keeps POSIX environ as bytes there
        return sorted((os.fsdecode(k), os.fsdecode(v)) for k, v in list(data.items()) if k.startswith(b"KERNELS_"))
    return sorted((k, v) for k, v in os.environ.items() if k.startswith("KERNELS_"))


def _copy(v: Any) -> Any:
    """A copy callers may change (configs hold dicts, lists and scalars only): deepcopy at a fifth of the cost."""
    if isinstance(v, dict):
        return {k: _copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_copy(x) for x in v]
    return v


@functools.lru_cache(maxsize=64)
def _get_config(kernel: str, arch: str, env: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    envd = dict(env)
    layers = [_load(str(DEFAULT_FILE))]
    extra = envd.get("KERNELS_TUNING")
    if extra:
        layers.append(_load(extra))
    cfg: dict[str, Any] = {}
    family = arch[:-1] + "x" if arch.startswith("sm_") and len(arch) >= 5 else None
    for data in layers:
        for key in ("default", family, arch):
            if key and key in data:
                cfg = _merge(cfg, (data[key] or {}).get(kernel, {}))
    prefix = f"KERNELS_{kernel.upper()}_"
    for name, value in envd.items():
        if name.startswith(prefix):
            # KERNELS_GEMV_BLOCK_N=64 sets cfg["block_n"]; KERNELS_GEMV_ROWS__BLOCK_N=32 sets cfg["rows"]["block_n"]
            *path, leaf = name[len(prefix):].lower().split("__")
            node = cfg
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = _parse_env(value)
    if not cfg:
        raise KeyError(f"no tuning entry for kernel {kernel!r}")
    return cfg
