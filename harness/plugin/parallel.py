"""Several GPUs at once: pytest-xdist for every level (`pytest -n N --config=a,b`).

What a parallel run guarantees (a pytest plugin, loaded by the root conftest):
- **One worker per config.** Every test of one configuration (those parametrized by `target`) carries
  `xdist_group(<config>)`, and `--dist loadgroup` is the default when xdist is on, so each config's
  server boots once, on one worker, and its goldens and baselines have one writer.
- **One GPU per worker.** The controller lists the visible GPUs once and hands them to each worker
  (`pytest_configure_node`); the worker sets `CUDA_VISIBLE_DEVICES` to its own GPU
  (`harness.engine.devices.device_for_worker`, which level 6 uses too) before it detects the platform or boots
  anything. A config whose server needs more GPUs (its `--tensor-parallel-size` x
  `--pipeline-parallel-size` x `--data-parallel-size`, from the flavour and model data) takes that
  many: its worker's GPU plus the next ones, for that server only.
- **No two servers on one slot.** A server boots only while its process holds the slot's lock: one lock
  per GPU (taken in one global order, so a multi-GPU config cannot deadlock with others), one for the
  whole machine on CPU. The locks are machine-wide (harness.engine.devices.machine_slot): another run's
  servers wait too, with or without xdist. Chosen for CPU: vLLM's CPU workers bind their
  threads to every core, so two servers on the shared cores would halve each other's speed and make
  level 4/5 numbers meaningless; with `-n 2` on CPU, configs therefore run one after another while
  the tests that boot nothing (unit tests, kernel conformance) run beside them.
- **One run directory.** The controller creates it and hands it to the workers; files several workers
  would write alike are per worker (`boots/<worker>.json`), and the controller merges them
  (`boots.json`) and writes the end-of-run report and summary from all workers' files.
Without xdist nothing here changes a run (the machine-wide slots are Suite.boot's).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import pytest

from harness.core.platform import forces_cpu
from harness.engine.devices import device_for_worker, gpu_set, machine_slot, visible_gpus, worker_index
from harness.session.suite import SUITE_KEY

# workerinput keys the controller hands to each worker
RUN_DIR_KEY = "suite_run_dir"
GPUS_KEY = "suite_visible_gpus"
LOADGROUP_KEY = "suite_loadgroup"
_PARALLEL_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size")


# -- xdist wiring --------------------------------------------------------------------------------
def worker_id(config: pytest.Config) -> str | None:
    """`gw0`, `gw1`, ... on an xdist worker; None on the controller or without xdist."""
    inp = getattr(config, "workerinput", None)
    return inp.get("workerid") if inp else None


def is_controller(config: pytest.Config) -> bool:
    """The process that runs no tests but collects every worker's reports (xdist with -n >= 1)."""
    return worker_id(config) is None and bool(getattr(config.option, "numprocesses", None)) \
        and getattr(config.option, "dist", "no") != "no"


def _dist_given(config: pytest.Config) -> bool:
    args = list(config.invocation_params.args) + os.environ.get("PYTEST_ADDOPTS", "").split()
    return any(a == "--dist" or a.startswith("--dist=") or a in ("--distload", "-d") for a in args)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`-n N` distributes with `loadgroup` unless --dist was given: a config's tests stay together."""
    if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load") and not _dist_given(config):
        config.option.dist = "loadgroup"


def shared_gpu_warning(worker: str | None, gpus: list[str]) -> str | None:
    """One line for the first worker that has no GPU of its own (more workers than GPUs), else None.

    Its servers still wait for the GPU's slot, but its GPU tests that boot no server (kernel conformance) do not, and a
    vLLM boot whose GPU another process frees memory on fails its memory profiling ("Error in memory profiling. Initial
    free memory ..., current free memory ...": seen on an H200 with the kernel tests beside a boot, 2026-12-01)."""
    index = worker_index(worker)
    if not gpus or index != len(gpus):
        return None
    return (f"suite: {index + 1} or more xdist workers for {len(gpus)} GPU(s): workers share a GPU, and a server booting "
            f"beside another worker's GPU tests can fail vLLM's memory profiling; use -n {len(gpus)} or fewer")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller side: hand each worker the run directory and the GPUs to choose from."""
    suite = node.config.stash.get(SUITE_KEY, None)
    if suite is not None:
        node.workerinput[RUN_DIR_KEY] = str(suite.run_dir)
    node.workerinput[GPUS_KEY] = [] if forces_cpu() else visible_gpus()
    warning = shared_gpu_warning(node.workerinput.get("workerid"), list(node.workerinput[GPUS_KEY]))
    reporter = node.config.pluginmanager.get_plugin("terminalreporter")
    if warning and reporter is not None:
        reporter.write_line(warning, yellow=True)
    # workers re-parse the command line, which lacks the --dist this plugin chose: tell them
    node.workerinput[LOADGROUP_KEY] = node.config.option.dist == "loadgroup"


def configure_worker(config: pytest.Config, environ: dict[str, str] | None = None) -> str | None:
    """Worker side, before the Suite exists: pin this worker to its GPU and join the shared run dir.

    Returns the GPU pinned (None on CPU or without xdist)."""
    inp = getattr(config, "workerinput", None)
    if not inp:
        return None
    env = os.environ if environ is None else environ
    if inp.get(RUN_DIR_KEY):
        config.option.run_dir = inp[RUN_DIR_KEY]
    if inp.get(LOADGROUP_KEY):
        config.option.loadgroup = True  # grouped test ids get an @<group> suffix, which the scheduler reads
        if not config.pluginmanager.has_plugin("suite-group-suffix"):
            config.pluginmanager.register(_GroupSuffix(), "suite-group-suffix")
    device = device_for_worker(inp.get("workerid"), list(inp.get(GPUS_KEY) or []))
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device  # before torch sees CUDA here, and for every server it boots
    return device


def group_name(item: pytest.Item) -> str | None:
    """The config an item belongs to (its `target` parameter), which names its xdist group."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "target" not in callspec.params:
        return None
    target = callspec.params["target"]
    return getattr(target, "name", None) or str(target)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = group_name(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))


class _GroupSuffix:
    """Make xdist's loadgroup see the groups on pytest >= 9.2.

    xdist (3.8) marks a grouped test by appending `@<group>` to `item._nodeid`, but pytest 9.2 keeps node
    ids in `Node._id`, so the suffix is lost and loadgroup silently spreads one config's tests over several
    workers (each booting its own server). Registered on workers only; runs after xdist's own hook and
    adds the suffix only where it is missing."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                             for m in item.iter_markers("xdist_group")})
            if not groups:
                continue
            nodeid = item.nodeid
            if nodeid.rfind("@") > nodeid.rfind("]"):
                continue  # xdist's suffix took
            suffixed = f"{nodeid}@{'_'.join(groups)}"
            if hasattr(item, "_id"):
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(suffixed)
            else:
                item._nodeid = suffixed


# -- slots ---------------------------------------------------------------------------------------
@contextmanager
def server_slot(worker: str | None, visible: list[str], need: int, is_cuda: bool,
                timeout_s: float | None = None) -> Iterator[dict[str, str]]:
    """Hold what one server of this worker runs on, for as long as it runs: the machine-wide slots
    (harness.engine.devices.machine_slot) of its GPUs, or the CPU slot.

    Yields the environment the server needs on top of the worker's (CUDA_VISIBLE_DEVICES when it takes
    more than the worker's own GPU). Without xdist: nothing here (Suite.boot takes the same slots for every
    server, so a run without xdist still waits for another run's server)."""
    if worker is None:
        yield {}
        return
    devices = gpu_set(device_for_worker(worker, visible), visible, need) if is_cuda else []
    with machine_slot(devices, owner=worker, timeout_s=timeout_s):
        yield {"CUDA_VISIBLE_DEVICES": ",".join(devices)} if need > 1 else {}


def all_gpus(config: pytest.Config) -> list[str]:
    """Every GPU of the run (the controller's list on a worker; this process's otherwise)."""
    inp = getattr(config, "workerinput", None)
    if inp and inp.get(GPUS_KEY) is not None:
        return list(inp[GPUS_KEY])
    return visible_gpus()
