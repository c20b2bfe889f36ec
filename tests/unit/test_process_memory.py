"""harness.engine.process_memory without a GPU (mutation audit): which NVML readings count towards the server's
process group, which GPUs CUDA_VISIBLE_DEVICES lets it read, and that MemorySampler keeps peaks, not the last
sample. A fake NVML with several GPUs and processes stands in for pynvml."""
from types import SimpleNamespace

import psutil
import pytest

from harness.core.nvml import NOT_AVAILABLE
from harness.engine import process_memory

GIB = process_memory.GIB


class MultiGpuNVML:
    """pynvml's surface for gpu_reading: `procs[i]` lists (pid, used bytes) on GPU i, `used[i]` its used memory."""

    def __init__(self, procs, used):
        self.procs, self.used = procs, used

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.used)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.procs[h]]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.used[h], total=141 * GIB)


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_only_the_server_processes_count_per_process():
    """Guards against summing every process NVML lists: another worker's server on the same GPU would be counted
    as this server's memory."""
    nvml = MultiGpuNVML([[(7, 10 * GIB), (99, 50 * GIB)]], [70 * GIB])
    r = process_memory.gpu_reading([7], nvml)
    assert (r.bytes, r.source) == (10 * GIB, "nvml per-process"), r


def test_not_available_per_process_memory_is_not_summed():
    """Guards against summing NVML_VALUE_NOT_AVAILABLE (2**64 - 1) as bytes: the reading must fall back to the
    device's used memory instead of reporting ~16 EiB."""
    nvml = MultiGpuNVML([[(7, NOT_AVAILABLE)]], [12 * GIB])
    r = process_memory.gpu_reading([7], nvml)
    assert (r.bytes, r.source) == (12 * GIB, "nvml device used"), r


def test_a_listed_process_with_zero_bytes_falls_back_to_device_memory():
    """Guards against trusting a per-process total of 0 (NVML lists the process but without its memory): the
    reading must be the device's used memory, not 0 GiB."""
    nvml = MultiGpuNVML([[(7, 0)]], [12 * GIB])
    r = process_memory.gpu_reading([7], nvml)
    assert (r.bytes, r.source) == (12 * GIB, "nvml device used"), r


def test_per_process_memory_sums_over_the_visible_gpus():
    """The server's processes on two GPUs add up (tensor parallel)."""
    nvml = MultiGpuNVML([[(7, 10 * GIB)], [(8, 11 * GIB)]], [20 * GIB, 20 * GIB])
    assert process_memory.gpu_reading([7, 8], nvml).bytes == 21 * GIB


@pytest.mark.parametrize("env,count,want", [
    ("1", 2, [1]),
    ("0,2", 2, [0]),        # index 2 does not exist on a 2-GPU host
    ("1,2", 2, [1]),        # count itself is out of range
    ("", 3, [0, 1, 2]),     # set but empty: every GPU, not none
    ("  ", 3, [0, 1, 2]),
    ("GPU-1234,1", 3, [0, 1, 2]),  # a UUID among indices: cannot map, read every GPU
])
def test_visible_indices_follow_cuda_visible_devices(monkeypatch, env, count, want):
    """Guards against an off-by-one in the range check (an index equal to the GPU count would make NVML raise and
    the whole reading read as unavailable), against an empty CUDA_VISIBLE_DEVICES selecting no GPU at all
    (the device-wide fallback would read 0 bytes), and against mapping a partly-UUID list by its digits."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert process_memory._visible_indices(count) == want, (env, count)


def test_device_memory_counts_only_the_visible_gpu(monkeypatch):
    """An xdist worker pinned to GPU 1 reads GPU 1's used memory, not every GPU's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml = MultiGpuNVML([[], []], [30 * GIB, 5 * GIB])
    assert process_memory.gpu_reading([7], nvml).bytes == 5 * GIB


def test_rss_skips_a_process_that_exited(monkeypatch):
    """Guards against a vanished pid (a worker that exited between listing the group and reading it) raising out of
    rss_bytes: the sampler thread would die and the peak would stop being tracked."""
    real = psutil.Process

    def process(pid):
        if pid == 424242:
            raise psutil.NoSuchProcess(pid)
        return real(pid)

    monkeypatch.setattr(process_memory.psutil, "Process", process)
    import os
    assert process_memory.rss_bytes([424242, os.getpid()]) == process_memory.rss_bytes([os.getpid()]) > 0


def _scripted_sampler(monkeypatch, rss, gpu):
    """A MemorySampler whose readings follow the scripts `rss` / `gpu` (one value per sample)."""
    it_rss, it_gpu = iter(rss), iter(gpu)
    monkeypatch.setattr(process_memory, "rss_bytes", lambda pids: next(it_rss))
    monkeypatch.setattr(process_memory, "gpu_reading",
                        lambda pids, nvml=None: process_memory.GpuReading(next(it_gpu), "nvml per-process"))
    return process_memory.MemorySampler(lambda: [7], interval_s=3600)


def test_sampler_keeps_the_peak_not_the_last_sample(monkeypatch):
    """Guards against peak_rss / peak_gpu being overwritten by each sample: a workload whose memory drops at the end
    would report its final, lower memory as its peak."""
    s = _scripted_sampler(monkeypatch, [5, 9, 3], [50, 90, 30])
    s.sample(), s.sample(), s.sample()
    assert (s.peak_rss, s.peak_gpu, s.samples) == (9, 90, 3), s


def test_sampler_samples_again_when_the_workload_ends(monkeypatch):
    """Guards against dropping the sample taken on leaving the `with` block: a workload shorter than the interval
    would then report only the memory from before it ran."""
    s = _scripted_sampler(monkeypatch, [5, 9], [50, 90])
    with s:
        pass
    assert s.samples == 2 and (s.peak_rss, s.peak_gpu) == (9, 90), s
