"""Several GPUs at once (harness/plugin/parallel.py): grouping, pinning, slots and per-worker files, without vLLM."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.errors import SuiteError
from harness.core.filelock import slot_timeout_s
from harness.engine import devices
from harness.plugin import parallel
from harness.report.listing import run_summary
from harness.session import suite as suite_mod

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch) -> Path:
    """The machine-wide slots of these tests in their own folder (not the machine's, which a real run may hold)."""
    path = tmp_path / "machine-locks"
    monkeypatch.setenv(devices.LOCK_DIR_ENV, str(path))
    # these tests wait on purpose: their notices would go to the terminal, past the capture (the root conftest's)
    monkeypatch.setattr(devices, "_wait_notice", [lambda text: None])
    # GPUs by the names the tests give them, on a GPU machine too (NVML would name them by UUID: tested apart below)
    monkeypatch.setattr(devices, "_nvml_gpus", lambda: None)
    return path


def test_gpus_needed_is_the_product_of_the_parallel_sizes():
    assert devices.gpus_needed(["--max-num-seqs", "2", "--tensor-parallel-size", "1"]) == 1
    assert devices.gpus_needed(["--tensor-parallel-size", "2"]) == 2
    assert devices.gpus_needed(["--tensor-parallel-size=2", "--pipeline-parallel-size", "2"]) == 4
    assert devices.gpus_needed(["--data-parallel-size", "2", "--enforce-eager"]) == 2
    assert devices.gpus_needed([]) == 1
    # as vLLM's argparse reads it: a --server-arg after the config's own size replaces it
    assert devices.gpus_needed(["--tensor-parallel-size", "2", "--tensor-parallel-size=1"]) == 1


def test_a_flavour_with_tensor_parallel_declares_its_gpus_in_its_data():
    """The count comes from the resolved server flags, i.e. the flavour's (and model's) data."""
    from harness.config.catalog import Catalog

    cat = Catalog()
    spec = cat.flavour("upstream").resolve(cat.parse("marlin-bf16"), "sm_90", {"--tensor-parallel-size": 2})
    assert devices.gpus_needed(spec.args) == 2
    assert devices.gpus_needed(cat.flavour("upstream").resolve(cat.parse("marlin-bf16"), "sm_90").args) == 1


def test_visible_gpus_honour_cuda_visible_devices():
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "4, 6"}) == ["4", "6"]
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert devices.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert devices.visible_gpus({}, count=2) == ["0", "1"]
    assert devices.visible_gpus({}, count=0) == []


def test_gpu_set_starts_with_the_workers_own_gpu_and_wraps():
    assert devices.gpu_set("1", ["0", "1"], 1) == ["1"]
    assert devices.gpu_set("1", ["0", "1"], 2) == ["1", "0"]
    assert devices.gpu_set("6", ["2", "4", "6", "7"], 3) == ["6", "7", "2"]
    with pytest.raises(ValueError):
        devices.gpu_set("0", ["0"], 2)


def _fake_config(workerinput=None, run_dir=None):
    cfg = SimpleNamespace(option=SimpleNamespace(run_dir=run_dir, numprocesses=None, dist="no"))
    if workerinput is not None:
        cfg.workerinput = workerinput
    return cfg


def test_configure_worker_pins_its_gpu_and_joins_the_run_dir(tmp_path):
    env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": "0,1"}
    cfg = _fake_config({"workerid": "gw1", parallel.RUN_DIR_KEY: str(tmp_path), parallel.GPUS_KEY: ["0", "1"]})
    assert parallel.configure_worker(cfg, env) == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and cfg.option.run_dir == str(tmp_path)
    # more workers than GPUs: they share, round robin (their slots then serialize the servers)
    env = {}
    assert parallel.configure_worker(_fake_config({"workerid": "gw2", parallel.GPUS_KEY: ["0", "1"]}), env) == "0"
    assert env == {"CUDA_VISIBLE_DEVICES": "0"}
    # CPU: nothing to pin
    env = {}
    assert parallel.configure_worker(_fake_config({"workerid": "gw0", parallel.GPUS_KEY: []}), env) is None and env == {}
    # not a worker: nothing happens
    env = {}
    assert parallel.configure_worker(_fake_config(None), env) is None and env == {}


def test_worker_id_and_controller():
    assert parallel.worker_id(_fake_config({"workerid": "gw3"})) == "gw3"
    assert parallel.worker_id(_fake_config(None)) is None
    ctl = _fake_config(None)
    ctl.option.numprocesses, ctl.option.dist = 2, "loadgroup"
    assert parallel.is_controller(ctl) and not parallel.is_controller(_fake_config(None))


def test_the_cpu_slot_lets_one_server_run_at_a_time(tmp_path):
    with parallel.server_slot("gw0", [], 1, is_cuda=False) as env:
        assert env == {}
        with pytest.raises(SuiteError, match="CPU server slot"):
            with parallel.server_slot("gw1", [], 1, is_cuda=False, timeout_s=1):
                pass
    with parallel.server_slot("gw1", [], 1, is_cuda=False, timeout_s=1):
        pass  # released: free again


def test_a_workers_second_server_shares_its_slot_and_other_workers_still_wait(tmp_path):
    """The worker's session server holds the slot; its level 6 server asks again from the same process (it waited
    for itself until the slot timeout). Another worker still waits, until both of the first worker's are gone."""
    for cuda, gpus in ((False, []), (True, ["0"])):
        with parallel.server_slot("gw0", gpus, 1, is_cuda=cuda, timeout_s=1):
            with parallel.server_slot("gw0", gpus, 1, is_cuda=cuda, timeout_s=1):
                with pytest.raises(SuiteError, match="slot"):
                    with parallel.server_slot("gw1", gpus, 1, is_cuda=cuda, timeout_s=1):
                        pass
            with pytest.raises(SuiteError, match="slot"):  # the inner one gone, the outer still holds it
                with parallel.server_slot("gw1", gpus, 1, is_cuda=cuda, timeout_s=1):
                    pass
        with parallel.server_slot("gw1", gpus, 1, is_cuda=cuda, timeout_s=1):
            pass  # both released


def test_without_xdist_the_plugin_takes_no_slot(lock_dir):
    """Without xdist the slots are Suite.boot's (below), taken for every server, not the plugin's."""
    with parallel.server_slot(None, [], 1, is_cuda=False) as env:
        assert env == {}
        assert not lock_dir.exists()


_HOLD_SLOT = """
import sys, time
sys.path.insert(0, {repo!r})
import harness.engine.devices
harness.engine.devices._nvml_gpus = lambda: None  # the names as given, as in the tests' own process
from harness.engine.devices import machine_slot
with machine_slot({devices!r}, note="pid of the other run (nightly.sh), server cfg-x"):
    print("held", flush=True)
    time.sleep({hold})
"""


def _other_run_holding(devices_: list[str], hold: float) -> subprocess.Popen:
    """Another process (another run of the suite) holding the machine-wide slots of `devices_` for `hold` s."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), devices=devices_, hold=hold)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_another_runs_server_holds_the_gpu_so_this_run_waits_naming_it(monkeypatch):
    """Two pytest runs (a nightly job and one started by hand) each booted a server on GPU 0: the second server's
    memory profiling failed, or both measured half speed and level 4/5 blamed the kernels. The slots are
    machine-wide now: a run without xdist waits for the other run's server, says who holds it, and times out in
    one line naming the holder; another GPU is free."""
    told: list[str] = []
    monkeypatch.setattr(devices, "_wait_notice", [told.append])  # under pytest: the terminal, past the capture
    other = _other_run_holding(["0"], 30)
    try:
        with pytest.raises(SuiteError, match="GPU 0 slot") as e:
            with devices.machine_slot(["0"], timeout_s=1):
                pass
        assert "held by pid of the other run (nightly.sh), server cfg-x, since " in str(e.value)
        assert "\n" not in str(e.value)
        assert len(told) == 1 and told[0].startswith("waiting up to 1 s for the GPU 0 slot: held by pid of the other run")
        with devices.machine_slot(["1"], timeout_s=1):
            pass  # GPU 1 is not the other run's
        with pytest.raises(SuiteError, match="CPU server slot"):  # an xdist worker of this run waits as well
            other.kill(), other.wait()
            other = _other_run_holding([], 30)
            with parallel.server_slot("gw0", [], 1, is_cuda=False, timeout_s=1):
                pass
    finally:
        other.kill(), other.wait()
    with devices.machine_slot([], timeout_s=1):
        pass  # the holder died: its slot is free (the OS drops its lock), with no stale file to clear


def test_a_wait_ends_when_the_other_server_stops(lock_dir):
    other = _other_run_holding(["0"], 1.5)
    start = time.monotonic()
    with devices.machine_slot(["0"], timeout_s=60):
        waited = time.monotonic() - start
    other.wait(timeout=10)
    assert 0.5 < waited < 30, waited


def test_one_processs_servers_share_its_slot_across_threads_and_the_last_to_leave_releases_it():
    """A server booted ahead on another thread (harness.session.ahead) while the first still runs shares the
    process's slot; the first stopping before it must not release the slot under it."""
    first = devices.machine_slot(["0"], timeout_s=1)
    first.__enter__()
    got = threading.Event()
    leave = threading.Event()

    def second():
        with devices.machine_slot(["0"], timeout_s=1):
            got.set()
            leave.wait(10)

    t = threading.Thread(target=second)
    t.start()
    assert got.wait(5)  # shared, no wait for itself
    first.__exit__(None, None, None)
    probe = subprocess.run([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), devices=["0"], hold=0)],
                           capture_output=True, text=True, env={**os.environ, "SUITE_SLOT_TIMEOUT": "1"}, timeout=60)
    assert probe.returncode != 0 and "GPU 0 slot" in probe.stderr  # still held by the second server
    leave.set()
    t.join(10)
    probe = subprocess.run([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), devices=["0"], hold=0)],
                           capture_output=True, text=True, env={**os.environ, "SUITE_SLOT_TIMEOUT": "1"}, timeout=60)
    assert probe.returncode == 0, probe.stderr  # both gone: free


def test_suite_boot_holds_the_machine_slot_until_its_server_stops(tmp_path, monkeypatch):
    """Every server the suite boots (tests and scripts, with or without xdist) holds its GPUs' (on CPU: the CPU's)
    slot from before its process starts until it stops, and gives it back when the boot fails."""
    from harness.session.suite import Suite

    held: list[str] = []  # the slot this machine's server takes: its GPU's, or the CPU's

    class FakeServer:
        url, served_name, boot_seconds, boot_memory = "http://127.0.0.1:9", "fake", 0.1, None

        def __init__(self, model_path, args, env, log, boot_timeout_s):
            self.fail = "--fail" in args

        def start(self):
            probe = subprocess.run([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), devices=held, hold=0)],
                                   capture_output=True, text=True, timeout=60,
                                   env={**os.environ, "SUITE_SLOT_TIMEOUT": "1"})
            assert probe.returncode != 0 and "slot" in probe.stderr, "started without the slot"
            if self.fail:
                raise SuiteError("boot failed")
            return self

        def stop(self):
            pass

    monkeypatch.setattr(suite_mod, "VllmServer", FakeServer)
    monkeypatch.setattr(suite_mod.hooks, "random_weights_problem", lambda *a: None)
    suite = Suite.create(None, None, None, None, str(tmp_path), 60)
    target = next(t for t in suite.targets() if t.runnable)
    held += devices.server_gpus(dict(os.environ), [], suite.platform.is_cuda)
    free = lambda: subprocess.run([sys.executable, "-c", _HOLD_SLOT.format(repo=str(REPO), devices=held, hold=0)],  # noqa: E731
                                  capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "SUITE_SLOT_TIMEOUT": "1"}).returncode == 0
    with suite.boot(target):
        assert not free()
    assert free()
    with pytest.raises(SuiteError, match="boot failed"):
        suite.boot(target, args_extra=["--fail"])
    assert free()


def test_gpu_slots_one_gpu_per_worker_and_a_tensor_parallel_config_takes_two(tmp_path):
    gpus = ["0", "1"]
    with parallel.server_slot("gw0", gpus, 1, is_cuda=True) as env0:
        assert env0 == {}  # the worker's own pin (CUDA_VISIBLE_DEVICES=0) is what its server inherits
        with parallel.server_slot("gw1", gpus, 1, is_cuda=True, timeout_s=1) as env1:
            assert env1 == {}  # the other GPU is free: both boot at once
        with pytest.raises(SuiteError, match="GPU 0 slot"):  # TP=2 on gw1 needs GPU 0 too
            with parallel.server_slot("gw1", gpus, 2, is_cuda=True, timeout_s=1):
                pass
    with parallel.server_slot("gw1", gpus, 2, is_cuda=True, timeout_s=1) as env:
        assert env == {"CUDA_VISIBLE_DEVICES": "1,0"}


def test_multi_gpu_slots_are_taken_in_one_order_so_they_cannot_deadlock(tmp_path):
    """gw0 and gw1 both want GPUs 0 and 1 (TP=2), starting from their own: both lock 0 first, so one
    waits for the other instead of each holding half."""
    gpus, done, errors = ["0", "1"], [], []

    def run(worker):
        try:
            with parallel.server_slot(worker, gpus, 2, is_cuda=True, timeout_s=20):
                time.sleep(0.5)
                done.append(worker)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in ("gw0", "gw1")]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert not errors and sorted(done) == ["gw0", "gw1"]


def test_per_worker_boot_files_merge_into_boots_json(tmp_path):
    suite_mod.write_worker_boots(tmp_path, "gw1", [{"config": "b", "ok": True, "boot_seconds": 50.0}])
    suite_mod.write_worker_boots(tmp_path, "gw0", [{"config": "a", "ok": True, "boot_seconds": 40.0}])
    merged = suite_mod.merge_boots(tmp_path)
    assert [(b["config"], b["worker"]) for b in merged] == [("a", "gw0"), ("b", "gw1")]
    assert json.loads((tmp_path / "boots.json").read_text()) == merged


def test_summary_reads_configs_from_xdist_group_suffixed_ids():
    from harness.config.catalog import Catalog
    from harness.core.platform import Platform

    suite = SimpleNamespace(catalog=Catalog(), platform=Platform("cpu", "test cpu", None), flavour=SimpleNamespace(name="cpu"),
                            model_or_error=SimpleNamespace(alias="tiny-gpt-oss"), boots=[{"config": "cpu-bf16", "boot_seconds": 42.0}],
                            run_dir=Path("/tmp/x"), run_dir_default=False)
    # the root conftest's makereport sets param_id from the test's parameters; the node id's `@group` suffix
    # (xdist's loadgroup) is no longer parsed
    rep = SimpleNamespace(when="call", keywords={"level1": 1}, param_id="cpu-bf16",
                          nodeid="tests/level1_smoke/test_smoke.py::test_health_is_ok[cpu-bf16]@cpu-bf16")
    text = run_summary(suite, {"passed": [rep]})
    assert "cpu-bf16" in text and "1ok" in text and "42" in text


def test_the_summary_shows_each_configs_own_server_boot_not_a_checks():
    from harness.config.catalog import Catalog
    from harness.core.platform import Platform

    boots = [{"config": "cpu-bf16", "tag": "__level6", "boot_seconds": 190.0},
             {"config": "cpu-bf16", "tag": "", "boot_seconds": 42.0},
             {"config": "cpu-bf16", "tag": "__fault", "boot_seconds": 170.0},
             {"config": "cpu-bf16-eager", "tag": "__level6", "boot_seconds": 88.0}]
    suite = SimpleNamespace(catalog=Catalog(), platform=Platform("cpu", "test cpu", None), flavour=SimpleNamespace(name="cpu"),
                            model_or_error=SimpleNamespace(alias="tiny-gpt-oss"), boots=boots, run_dir=Path("/tmp/x"), run_dir_default=False)
    reps = [SimpleNamespace(when="call", keywords={"level1": 1}, param_id=c, nodeid=f"t.py::t[{c}]")
            for c in ("cpu-bf16", "cpu-bf16-eager")]
    rows = {line.split()[0]: line.split()[1] for line in run_summary(suite, {"passed": reps}).splitlines()[2:-1]}
    assert rows == {"cpu-bf16": "42", "cpu-bf16-eager": "88"}  # a config with no own server: its first boot


# -- a real xdist run of a stand-in suite: grouping, loadgroup default, pinning ----------------------
_STANDIN_CONFTEST = """
import json, os, sys
sys.path.insert(0, {repo!r})
import pytest
from harness.engine import devices
from harness.plugin import parallel
from harness.session import suite as suite_mod
pytest_plugins = ["harness.plugin.parallel"]

class T:
    def __init__(self, name): self.name = name

def pytest_configure(config):
    parallel.configure_worker(config)

def pytest_generate_tests(metafunc):
    if "target" in metafunc.fixturenames:
        ts = [T("cfg-a"), T("cfg-b")]
        metafunc.parametrize("target", ts, ids=[t.name for t in ts], scope="session")

@pytest.fixture
def record(request):
    def rec(target):
        out = os.path.join({out!r}, os.environ.get("PYTEST_XDIST_WORKER", "main") + ".jsonl")
        with open(out, "a") as f:
            f.write(json.dumps({{"worker": os.environ.get("PYTEST_XDIST_WORKER"), "config": target.name,
                                 "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "dist": request.config.option.dist}}) + "\\n")
    return rec
"""

_STANDIN_TESTS = """
import time
import pytest

@pytest.mark.parametrize("i", range(6))
def test_level(record, target, i):
    time.sleep(0.05)
    record(target)

@pytest.mark.parametrize("j", range(4))
def test_without_a_server(j):
    pass
"""


def test_an_xdist_run_keeps_each_config_on_one_worker_with_its_own_gpu(tmp_path):
    proj, out = tmp_path / "proj", tmp_path / "out"
    proj.mkdir(), out.mkdir()
    (proj / "conftest.py").write_text(_STANDIN_CONFTEST.format(repo=str(REPO), out=str(out)))
    (proj / "test_standin.py").write_text(_STANDIN_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SUITE_PLATFORM"))}
    env["CUDA_VISIBLE_DEVICES"] = "5,7"  # what the controller hands out (no GPU is touched)
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", str(proj)],
                       cwd=proj, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for p in out.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(rows) == 12
    by_config: dict[str, set] = {}
    for row in rows:
        by_config.setdefault(row["config"], set()).add((row["worker"], row["gpu"]))
        assert row["dist"] == "no"  # workers run their share serially; the controller used loadgroup
    assert all(len(v) == 1 for v in by_config.values()), by_config  # one worker (and GPU) per config
    expected = {"gw0": "5", "gw1": "7"}  # each worker pinned to its own GPU of the controller's list
    assert all(row["gpu"] == expected[row["worker"]] for row in rows), rows


def test_more_workers_than_gpus_is_told_once_with_the_fix():
    """`-n 3` on one GPU: the second worker (gw1) is the first without a GPU of its own, and the line names the fix;
    as many workers as GPUs, CPU (no GPUs) and no xdist say nothing."""
    from harness.plugin.parallel import shared_gpu_warning

    line = shared_gpu_warning("gw1", ["0"])
    assert line is not None and "use -n 1 or fewer" in line and "memory profiling" in line and "\n" not in line
    assert shared_gpu_warning("gw2", ["0"]) is None  # told once, for the first extra worker
    assert shared_gpu_warning("gw1", ["0", "1"]) is None and shared_gpu_warning("gw2", ["0", "1"]) is not None
    assert shared_gpu_warning("gw1", []) is None and shared_gpu_warning(None, ["0"]) is None


@pytest.mark.parametrize("value", ["-1", "0", "nan", "12h"])
def test_a_slot_timeout_that_never_ends_or_is_not_seconds_is_one_line(tmp_path, monkeypatch, value):
    """filelock waits forever on a negative timeout (a worker once waited for a slot with no end), and "12h" was a
    ValueError traceback when the plugin loaded."""
    monkeypatch.setenv("SUITE_SLOT_TIMEOUT", value)
    with pytest.raises(SuiteError, match=r"SUITE_SLOT_TIMEOUT=.*expected seconds above 0") as e:
        with parallel.server_slot("gw0", [], 1, is_cuda=False):
            pass
    assert "\n" not in str(e.value)
    monkeypatch.setenv("SUITE_SLOT_TIMEOUT", "5")
    assert slot_timeout_s() == 5.0


def test_a_lock_folder_this_user_cannot_write_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    """The slots' folder is shared by every user of the machine; one created by another user without write access for
    this one (or a read-only /tmp) was a PermissionError traceback at the first boot."""
    if os.geteuid() == 0:
        locked = tmp_path / "file-not-folder"
        locked.write_text("")  # root writes anywhere: a path under a plain file fails for root too
        monkeypatch.setenv(devices.LOCK_DIR_ENV, str(locked / "locks"))
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv(devices.LOCK_DIR_ENV, str(ro))
    with pytest.raises(SuiteError, match=r"cannot take the GPU 0 slot: .*SUITE_LOCK_DIR") as e:
        with devices.machine_slot(["0"], timeout_s=1):
            pass
    assert "\n" not in str(e.value)


def _slots_taken(monkeypatch) -> list[str]:
    """The lock names `machine_slot` takes from now on, in the order it takes them."""
    taken: list[str] = []
    real = devices.shared_by_owner

    def record(owner, path, *args, **kwargs):
        taken.append(Path(path).stem)
        return real(owner, path, *args, **kwargs)

    monkeypatch.setattr(devices, "shared_by_owner", record)
    return taken


def test_every_run_takes_a_servers_gpu_slots_in_one_order(monkeypatch):
    """Two runs each booting a two-GPU server must take the slots in the same order, or each holds one and waits
    for the other's: by GPU index (numerically: 2 before 10), whatever order CUDA_VISIBLE_DEVICES lists them in."""
    taken = _slots_taken(monkeypatch)
    for listed in (["10", "2"], ["2", "10"]):
        taken.clear()
        with devices.machine_slot(listed, timeout_s=1):
            pass
        assert taken == ["gpu-2", "gpu-10"], taken


H200S = (("NVIDIA H200", "GPU-aaaa1111-0000"), ("NVIDIA H200", "GPU-bbbb2222-0000"))


def test_one_gpu_named_by_index_or_by_uuid_is_one_slot(monkeypatch):
    """A nightly job with CUDA_VISIBLE_DEVICES=1 and a run by hand with CUDA_VISIBLE_DEVICES=GPU-bbbb... name one GPU:
    with a slot per name both booted a server on it. Where NVML lists the GPUs, every name becomes the UUID."""
    monkeypatch.setattr(devices, "_nvml_gpus", lambda: H200S)
    taken = _slots_taken(monkeypatch)
    for name in ("1", "GPU-bbbb2222-0000", "GPU-bbbb"):  # CUDA takes a unique UUID prefix too
        taken.clear()
        with devices.machine_slot([name], timeout_s=1):
            pass
        assert taken == ["gpu-gpu-bbbb2222-0000"], (name, taken)
    other = devices.machine_slot(["GPU-bbbb"], owner="the other run", timeout_s=1)
    other.__enter__()
    try:
        with pytest.raises(SuiteError, match=r"GPU 1 slot \(GPU-bbbb2222-0000\)"):
            with devices.machine_slot(["1"], timeout_s=1):
                pass
    finally:
        other.__exit__(None, None, None)


def test_gpu_names_stay_as_given_where_nvml_cannot_say_which_gpu_they_mean(monkeypatch):
    monkeypatch.setattr(devices, "_nvml_gpus", lambda: None)
    assert devices.canonical_gpus(["0", "GPU-bbbb"]) == ["0", "GPU-bbbb"]
    mixed = (("NVIDIA H200", "GPU-aaaa1111-0000"), ("NVIDIA L4", "GPU-bbbb2222-0000"))
    monkeypatch.setattr(devices, "_nvml_gpus", lambda: mixed)
    # CUDA lists the fastest first unless told to follow the PCI bus: an index may not be NVML's index
    assert devices.canonical_gpus(["1", "GPU-bbbb", "MIG-1234", "GPU-"], {}) == ["1", "GPU-bbbb2222-0000", "MIG-1234", "GPU-"]
    assert devices.canonical_gpus(["1", "7"], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == ["GPU-bbbb2222-0000", "7"]
