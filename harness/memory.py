"""Memory of a server's process tree: CPU RSS (psutil) and GPU memory (NVML), sampled in a thread."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil

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


def gpu_bytes(pids: list[int]) -> int | None:
    """GPU memory used by the given processes on every visible GPU, via NVML; None without NVML.

    In containers NVML may list no per-process usage; then the device's used memory is taken,
    which over-counts whatever else runs on the GPU (the suite runs one server at a time).
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU machine
        return None
    try:
        wanted, total, any_listed, device_used = set(pids), 0, False, 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            device_used += pynvml.nvmlDeviceGetMemoryInfo(h).used
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                any_listed = True
                if p.pid in wanted and p.usedGpuMemory:
                    total += p.usedGpuMemory
        return total if any_listed and total else device_used
    finally:
        pynvml.nvmlShutdown()


@dataclass
class MemorySampler:
    """Peak RSS and GPU memory of a process group while a workload runs (`with` block)."""

    pids_fn: callable
    interval_s: float = 0.25
    peak_rss: int = 0
    peak_gpu: int | None = None
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        pids = self.pids_fn()
        self.peak_rss = max(self.peak_rss, rss_bytes(pids))
        gpu = gpu_bytes(pids)
        if gpu is not None:
            self.peak_gpu = max(self.peak_gpu or 0, gpu)
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
        """GPU memory where there is a GPU (what limits a GB10), else the CPU RSS."""
        return (self.peak_gpu if self.peak_gpu is not None else self.peak_rss) / GIB
