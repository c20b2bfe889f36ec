"""Which GPUs a server takes: the parallel sizes in its flags, the visible devices, and the one GPU each
pytest-xdist worker pins its servers to (levels 1-6 and the matrix share these rules)."""
from __future__ import annotations

import os

from harness.core.platform import detect_platform
from harness.engine.server import flags

_PARALLEL_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size")


def gpus_needed(args: list[str]) -> int:
    """GPUs one server takes: the product of its parallel sizes, read as vLLM reads its argv (`server.flags`: the
    last occurrence of a flag wins, so a --server-arg overrides the config's own size)."""
    given = flags(args)
    need = 1
    for flag in _PARALLEL_FLAGS:
        try:
            need *= max(1, int(given.get(flag, "1")))
        except ValueError:
            pass  # vLLM refuses the value itself, with its own message
    return need


def visible_gpus(environ: dict[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPUs this process may hand out: CUDA_VISIBLE_DEVICES's entries when set, else 0..count-1
    (count: torch's device count on a CUDA platform, 0 on CPU)."""
    env = os.environ if environ is None else environ
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if count is None:
        count = _cuda_device_count()
    return [str(i) for i in range(count)]


def _cuda_device_count() -> int:
    if not detect_platform().is_cuda:
        return 0
    import torch

    return torch.cuda.device_count()


def gpu_set(own: str, visible: list[str], need: int) -> list[str]:
    """`need` GPUs for a server: the worker's own first, then the next visible ones (wrapping)."""
    if need > len(visible):
        raise ValueError(f"needs {need} GPUs, {len(visible)} visible")
    start = visible.index(own) if own in visible else 0
    return [visible[(start + k) % len(visible)] for k in range(need)]


def worker_index(worker_id: str | None) -> int:
    """pytest-xdist worker id (`gw3`) -> 3; not under xdist -> 0."""
    if not worker_id or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return 0
    return int(worker_id[2:])


def device_for_worker(worker_id: str | None, visible: list[str]) -> str | None:
    """The one GPU (an entry of `visible`) a worker pins its servers to; None without GPUs."""
    if not visible:
        return None
    return visible[worker_index(worker_id) % len(visible)]
