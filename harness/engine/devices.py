"""Which GPUs a server takes: the parallel sizes in its flags, the visible devices, the one GPU each
pytest-xdist worker pins its servers to (levels 1-6 and the matrix share these rules), and the machine-wide
slots that keep two runs' servers off one GPU (or, on CPU, off the shared cores)."""
from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from harness.core.filelock import shared_by_owner, slot_timeout_s
from harness.core.nvml import load as load_nvml
from harness.core.paths import slug, writable_dir
from harness.core.platform import detect_platform
from harness.engine.server import flags

# Where the slots' lock files live: one folder per machine, so that a nightly job and a run started by hand (or two
# checkouts of the suite) take turns. Two vLLM servers on one GPU fail the second's memory profiling or halve each
# other's speed, and a level 4/5 verdict measured that way blames the kernels.
LOCK_DIR_ENV = "SUITE_LOCK_DIR"

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


def machine_lock_dir() -> Path:
    """SUITE_LOCK_DIR, else `gpt-oss-suite-locks` in the system's temporary folder (every user's runs share it)."""
    given = os.environ.get(LOCK_DIR_ENV)
    if given:
        return Path(given)
    path = Path(tempfile.gettempdir()) / "gpt-oss-suite-locks"
    if not path.exists():
        try:
            path.mkdir(exist_ok=True)
            path.chmod(0o1777)  # like /tmp: any user may lock, none may remove another's files
        except OSError:
            pass  # taking a slot there says why in one line (harness.core.filelock)
    return path


def check_slot_settings() -> None:
    """SUITE_SLOT_TIMEOUT and SUITE_LOCK_DIR as the first server's slot will read them: checked when the run starts, so
    that a bad value is one line then, not after every test before the first boot has run."""
    slot_timeout_s()
    given = os.environ.get(LOCK_DIR_ENV)
    if given:
        writable_dir(Path(given), LOCK_DIR_ENV)


def slot_names(devices: list[str]) -> list[str]:
    """Lock file names of the slots a server takes: one per GPU (`gpu-0`, `gpu-GPU-8f2c...`), or `cpu` without GPUs.
    Give them `canonical_gpus` names, so that two runs naming one GPU by index and by UUID take one slot."""
    return [f"gpu-{slug(d)}" for d in devices] if devices else ["cpu"]


@functools.lru_cache(maxsize=1)
def _nvml_gpus() -> tuple[tuple[str, str], ...] | None:
    """(product name, UUID) of each GPU in NVML's index order (PCI bus order), or None where NVML cannot say."""
    nvml = load_nvml()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
        try:
            out = []
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name, uuid = nvml.nvmlDeviceGetName(h), nvml.nvmlDeviceGetUUID(h)
                out.append((name.decode() if isinstance(name, bytes) else str(name),
                            uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
            return tuple(out)
        finally:
            nvml.nvmlShutdown()
    except Exception:  # no driver, no permission: the names stay as given (the worst case is today's behaviour)
        return None


def canonical_gpus(devices: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """Each GPU by its UUID where NVML says which GPU a CUDA_VISIBLE_DEVICES entry means (an index, a UUID or a
    unique UUID prefix), else as given (no NVML; a MIG instance; an index on a machine whose CUDA order may differ
    from NVML's: CUDA lists the fastest GPU first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, which is NVML's order
    wherever all GPUs are one model)."""
    gpus = _nvml_gpus() if devices else None
    if not gpus:
        return list(devices)
    env = os.environ if environ is None else environ
    one_order = env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" or len({name for name, _ in gpus}) == 1
    out = []
    for d in devices:
        if d.isdigit():
            out.append(gpus[int(d)][1] if one_order and int(d) < len(gpus) else d)
            continue
        hits = [uuid for _, uuid in gpus if d.startswith("GPU-") and uuid.startswith(d)]
        out.append(hits[0] if len(hits) == 1 else d)
    return out


def server_gpus(env: dict[str, str], args: list[str], is_cuda: bool) -> list[str]:
    """The GPUs a server started with `env` and `args` takes: the first of its visible devices, as many as its
    parallel sizes ask; none on CPU."""
    if not is_cuda:
        return []
    return visible_gpus(env)[:gpus_needed(args)]


def _tell_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# How a wait for a slot is told: stderr (scripts); under pytest the root conftest sets one that writes past the
# capture, so a run that waits for another says so on the terminal while it waits, not after the fact.
_wait_notice: list[Callable[[str], None]] = [_tell_stderr]


def set_wait_notice(tell: Callable[[str], None] | None) -> None:
    """Where `machine_slot` says that it waits (None: stderr)."""
    _wait_notice[0] = tell or _tell_stderr


@contextmanager
def machine_slot(devices: list[str], owner: str | None = None, note: str = "",
                 timeout_s: float | None = None) -> Iterator[None]:
    """Hold the machine-wide slots of `devices` (GPU names; [] = the CPU slot) for as long as a server runs.

    One process's servers share its slots (`owner`, default this process: its xdist worker id, else its pid). The
    slots are taken in one order for every run (by UUID where NVML names the GPUs, else by index, then name) so two
    servers needing two GPUs each cannot deadlock; a wait says on the terminal who holds the slot, and one longer than
    SUITE_SLOT_TIMEOUT is one line naming the holder."""
    timeout_s = slot_timeout_s() if timeout_s is None else timeout_s
    # an xdist worker's slot (harness.plugin.parallel) and its Suite.boot's are one holder
    owner = owner or os.environ.get("PYTEST_XDIST_WORKER") or f"pid{os.getpid()}"
    # canonical names first, so that a run naming GPU 1 and one naming its UUID take one slot in one order
    named = sorted(zip(canonical_gpus(devices), devices),
                   key=lambda c: (0, int(c[0]), "") if c[0].isdigit() else (1, 0, c[0]))
    note = note or f"pid {os.getpid()} ({' '.join(sys.argv)[:160]})"
    note = f"{note}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    with ExitStack() as held:
        for name, (canon, given) in zip(slot_names([c for c, _ in named]), named or [("", "")]):
            what = "CPU server slot (one server at a time on shared cores)" if name == "cpu" else \
                f"GPU {given} slot" + ("" if canon == given else f" ({canon})")
            def on_wait(holder: str, what: str = what) -> None:
                _wait_notice[0](f"waiting up to {timeout_s:.0f} s for the {what}: {holder} "
                                "(SUITE_SLOT_TIMEOUT sets the limit)")

            held.enter_context(shared_by_owner(owner, machine_lock_dir() / f"{name}.lock", timeout_s, what, note,
                                               on_wait=on_wait))
        yield
