"""What a server's process group holds: resident memory, and GPU memory through NVML with the source of
each reading (per process, device-wide, or unavailable, as on GB10's unified memory). The engine's own
accounting, which the gate reads, is harness.perf.memory."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

from harness.core.nvml import NOT_AVAILABLE, error_name
from harness.core.nvml import load as load_nvml

GIB = 1024 ** 3


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of the given processes (the server's process group)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total



@dataclass
class GpuReading:
    bytes: int | None  # None: NVML could not say
    source: str  # "nvml per-process" / "nvml device used" / "unavailable"
    notes: list[str] = field(default_factory=list)  # NVML calls that failed and why


def gpu_reading(pids: list[int], nvml: Any = None) -> GpuReading:
    """GPU memory of the given processes via NVML, with the source; never raises.

    Per-process numbers where NVML lists them; else the devices' used memory (over-counts other
    processes; the suite runs one server at a time); else None with the reason (no NVML, or
    NOT_SUPPORTED on unified-memory GPUs such as GB10, where the caller falls back to the engine's
    own accounting and the process RSS)."""
    nvml = nvml if nvml is not None else load_nvml()
    if nvml is None:
        return GpuReading(None, "unavailable", ["pynvml not installed"])
    try:
        nvml.nvmlInit()
    except Exception as e:  # no driver: a CPU machine
        return GpuReading(None, "unavailable", [f"nvmlInit: {error_name(e)}"])
    try:
        wanted, per_proc, found, device_used, device_ok, notes = set(pids), 0, False, 0, True, []
        for i in _visible_indices(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception as e:
                procs = []
                notes.append(f"nvmlDeviceGetComputeRunningProcesses: {error_name(e)}")
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                if p.pid in wanted and used is not None and used != NOT_AVAILABLE:
                    per_proc += int(used)
                    found = True
            try:
                device_used += int(nvml.nvmlDeviceGetMemoryInfo(h).used)
            except Exception as e:
                device_ok = False
                notes.append(f"nvmlDeviceGetMemoryInfo: {error_name(e)}")
        if found and per_proc:
            return GpuReading(per_proc, "nvml per-process", notes)
        if device_ok:
            return GpuReading(device_used, "nvml device used", notes)
        return GpuReading(None, "unavailable", notes)
    except Exception as e:
        return GpuReading(None, "unavailable", [f"nvml: {error_name(e)}"])
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def gpu_bytes(pids: list[int]) -> int | None:
    """GPU memory of the given processes (see gpu_reading); None where NVML cannot say."""
    return gpu_reading(pids).bytes


def process_snapshot(pids: list[int], nvml: Any = None, want_gpu: bool = True) -> dict:
    """What the process group holds now: RSS, and GPU memory with its source (GiB)."""
    snap: dict[str, Any] = {"time": time.time(), "pids": len(pids), "rss_gib": round(rss_bytes(pids) / GIB, 4)}
    if want_gpu:
        r = gpu_reading(pids, nvml)
        snap.update(gpu_gib=None if r.bytes is None else round(r.bytes / GIB, 4), gpu_source=r.source,
                    gpu_notes=r.notes)
    return snap


def _visible_indices(count: int) -> list[int]:
    """The NVML indices of the GPUs this process (and the servers it boots) may use: CUDA_VISIBLE_DEVICES when
    it lists plain indices (xdist workers are pinned that way), else every GPU. NVML ignores that variable, and a
    device-wide reading of every GPU would count other workers' servers."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or not env.strip():
        return list(range(count))
    parts = [p.strip() for p in env.split(",") if p.strip()]
    if all(p.isdigit() for p in parts):
        return [int(p) for p in parts if int(p) < count]
    return list(range(count))  # UUIDs / MIG ids: cannot map without more NVML calls; per-process readings still apply



# ---------------------------------------------------------------------------------------- peak sampling


@dataclass
class MemorySampler:
    """Peak RSS and GPU memory of a process group while a workload runs (`with` block)."""

    pids_fn: Callable[[], list[int]]
    interval_s: float = 0.25
    peak_rss: int = 0
    peak_gpu: int | None = None
    gpu_source: str | None = None
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        pids = self.pids_fn()
        self.peak_rss = max(self.peak_rss, rss_bytes(pids))
        r = gpu_reading(pids)
        if r.bytes is not None:
            self.peak_gpu = max(self.peak_gpu or 0, r.bytes)
        self.gpu_source = r.source
        self.samples += 1

    def __enter__(self) -> "MemorySampler":
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    @property
    def peak_gb(self) -> float:
        """GPU memory where there is a GPU (what limits a GB10), else the CPU RSS, in GB (1e9 bytes): the results'
        `memory_peak_gb` and the report's "Peak mem (GB)", read next to the gate's 1 GB rule, which is 1e9 bytes too."""
        return (self.peak_gpu if self.peak_gpu is not None else self.peak_rss) / 1e9
