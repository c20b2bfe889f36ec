"""Level 4 review findings (measurement and results), each checked without a server: workloads files that would let one
workload's numbers overwrite another's or silently drop a section, values that crash mid-benchmark, server flags the
results did not record, broken results files, GPU metadata of the wrong GPU, the peak memory's unit and the
speculator's acceptance counted over warm-up requests. Fakes stand in for vLLM: a client whose /metrics counters
advance with every finished request, a booted server's process, a fake `nvidia-smi`."""
from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from harness.config.catalog import KernelExpectation
from harness.core.errors import SuiteError
from harness.core.platform import Platform
from harness.engine.client import StreamResult
from harness.engine.process_memory import MemorySampler
from harness.engine.server import flags
from harness.engine.server_metrics import SPEC_COUNTERS
from harness.perf import bench, benchmark, metadata
from harness.perf import results as perf_results
from harness.plugin import nightly
from harness.report.run_report import write_run_report

REPO = Path(__file__).resolve().parents[2]
BASE = "cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: [0]}\n"


def workloads_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


def refused(path: Path, platform: str = "cpu") -> str:
    """The one-line SuiteError load_workloads gives for `path`."""
    with pytest.raises(SuiteError) as e:
        bench.load_workloads(platform, 10 ** 9, path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message, message
    return message


# -- (1) one metric name, two workloads --------------------------------------------------------------------------
def test_a_concurrent_workload_of_one_request_is_refused(tmp_path):
    """`c: 1` named its metrics pp512 / tg32, the prefill and decode workloads' names, and overwrote their numbers."""
    message = refused(workloads_file(tmp_path, BASE + "  concurrent: [{c: 1, pp: 512, tg: 32}]\n"))
    assert "cpu.concurrent[0].c" in message and ">= 2" in message and "batch-1" in message, message


@pytest.mark.parametrize("text, metric", [
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [32, 32], depths: [0]}\n", "tg32"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [32], depths: [0, 0]}\n", "tg32"),
    (BASE + "  prefill: {pp: [128], depths: [512, 512]}\n", "pp128@d512"),
    # two batches of two that share a prompt length both yield pp512@c2
    (BASE + "  concurrent: [{c: 2, pp: 512, tg: 32}, {c: 2, pp: 512, tg: 64}]\n", "pp512@c2"),
])
def test_two_workloads_that_yield_one_metric_are_refused(tmp_path, text, metric):
    message = refused(workloads_file(tmp_path, text))
    assert f"both yield metric {metric}; remove the duplicate from" in message, message


@pytest.mark.parametrize("text, where", [
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [], depths: [0]}\n", "cpu.decode.tg"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: []}\n", "cpu.decode.depths"),
    (BASE + "  prefill: {pp: [], depths: [0]}\n", "cpu.prefill.pp"),
])
def test_an_empty_list_of_shapes_is_refused_not_a_section_measured_for_nothing(tmp_path, text, where):
    """`tg: []` loaded as no decode workload at all: level 5 then reported every decode metric only as not measured."""
    message = refused(workloads_file(tmp_path, text))
    assert f"{where} is []; it must be a list of integers" in message and "at least one" in message, message


def test_a_workloads_file_of_binary_junk_is_one_line(tmp_path):
    """Not UTF-8 (a bad copy): a UnicodeDecodeError traceback (pytest's INTERNALERROR) before the run."""
    path = tmp_path / "w.yaml"
    path.write_bytes(b"cpu:\xff\xfe\x00junk")
    assert "not UTF-8 text (byte 0xff at offset 4); fix the file" in refused(path)


class FakeEngine:
    """A vLLM stand-in: completions and streams of exactly the asked tokens; /metrics counters (the engine's request
    histograms and, with `spec`, the speculator's counters) advance with every finished request. The speculator
    accepts 2 of 3 drafted tokens per step on requests of more than 2 tokens, and nothing on the 2-token warm
    requests (their one draft is cut by max_tokens)."""

    def __init__(self, spec: bool = False):
        self.spec = spec
        self.totals = {"vllm:request_prefill_time_seconds_sum": 0.0, "vllm:request_decode_time_seconds_sum": 0.0,
                       "vllm:request_prefill_kv_computed_tokens_sum": 0.0, "vllm:request_generation_tokens_sum": 0.0,
                       "vllm:request_decode_time_seconds_count": 0.0, **dict.fromkeys(SPEC_COUNTERS, 0.0)}

    def _finish(self, prompt_tokens: int, generated: int) -> None:
        t = self.totals
        t["vllm:request_prefill_time_seconds_sum"] += 0.01
        t["vllm:request_decode_time_seconds_sum"] += 0.002 * (generated - 1)
        t["vllm:request_prefill_kv_computed_tokens_sum"] += prompt_tokens
        t["vllm:request_generation_tokens_sum"] += generated
        t["vllm:request_decode_time_seconds_count"] += 1
        if self.spec and generated >= 2:
            steps = 1 if generated == 2 else generated // 3
            t[SPEC_COUNTERS[0]] += steps
            t[SPEC_COUNTERS[1]] += 3 * steps
            t[SPEC_COUNTERS[2]] += (0 if generated == 2 else 2) * steps

    def tokenize(self, text: str) -> list[int]:
        return list(range(100, 400))

    def complete(self, prompt, max_tokens, **kw) -> dict:
        self._finish(len(prompt), max_tokens)
        return {"choices": [{"text": "x"}], "usage": {"prompt_tokens": len(prompt), "completion_tokens": max_tokens}}

    def stream(self, prompt, max_tokens, **kw) -> StreamResult:
        t0 = time.perf_counter()
        times = [t0 + 0.01 + 0.002 * i for i in range(max_tokens)]
        self._finish(len(prompt), max_tokens)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": max_tokens}
        return StreamResult("x", times, max_tokens, usage, t0, times[-1] + 0.001, "length")

    def get(self, path: str, timeout_s: float = 30):
        assert path == "/v1/models", path  # /metrics is read through the patched scrape
        return SimpleNamespace(json=lambda: {"data": [{"max_model_len": 4096}]})

    def version(self) -> str:
        return "0.0-fake"


def fake_suite(tmp_path: Path, server_args: list[str] | None = None) -> SimpleNamespace:
    def artifact(*parts: str) -> Path:
        path = tmp_path.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    return SimpleNamespace(platform=Platform("cpu", "fake cpu", None), flavour=SimpleNamespace(name="cpu"),
                           model=SimpleNamespace(alias="tiny", fingerprint=None), run_dir=tmp_path,
                           server_args=server_args or [], artifact=artifact)


def fake_server(engine: FakeEngine, spec_axis: str = "off", process=None) -> SimpleNamespace:
    spec = SimpleNamespace(args=["--dtype", "bfloat16"], env={"VLLM_CPU_KVCACHE_SPACE": "1"}, kernels=KernelExpectation())
    target = SimpleNamespace(name="cpu-bf16", spec=spec, config=SimpleNamespace(values={"spec": spec_axis}))
    return SimpleNamespace(client=lambda: engine, process=process, target=target, boot_seconds=1.0, trace_dir=None,
                           log_text=lambda: "")


@pytest.fixture
def engine(monkeypatch) -> FakeEngine:
    fake = FakeEngine()
    monkeypatch.setattr(bench, "scrape", lambda client: dict(client.totals))
    monkeypatch.setattr(benchmark, "scrape", lambda client: dict(client.totals), raising=False)
    monkeypatch.setattr(metadata, "pip_freeze", lambda path: "skipped (unit test)")
    return fake


def test_run_benchmark_refuses_a_metric_two_workloads_yield(tmp_path, engine, monkeypatch):
    """The last guard: whatever the loader let through, a metric is never silently replaced by another workload's."""
    path = workloads_file(tmp_path, BASE)
    twice = [bench.Workload("decode", 16, 8, 0, 1, 2, 0, 2), bench.Workload("decode", 16, 8, 0, 1, 2, 0, 2)]
    monkeypatch.setattr(bench, "load_workloads", lambda *a, **k: (twice, []))
    with pytest.raises(SuiteError, match=rf"workloads decode pp16/tg8 and decode pp16/tg8 both yield metric tg8; "
                                         rf"remove the duplicate from {path}"):
        benchmark.run_benchmark(fake_suite(tmp_path), fake_server(engine), None, path)


# -- (2) unknown keys ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, where, key", [
    ("  prefil: {pp: [128], depths: [0]}\n", "cpu", "prefil"),
    ("  latncy: {pp: 512, tg: 32}\n", "cpu", "latncy"),
    ("  concurent: [{c: 2, pp: 128, tg: 32}]\n", "cpu", "concurent"),
    ("  prefill: {pp: [128], depth: [0]}\n", "cpu.prefill", "depth"),
    ("  latency: {pp: 512, tg: 32, runs: 3}\n", "cpu.latency", "runs"),
    ("  concurrent: [{c: 2, pp: 128, tg: 32, depth: 0}]\n", "cpu.concurrent[0]", "depth"),
    ("cpuu: {runs: 3}\n", "the top level", "cpuu"),
])
def test_an_unknown_key_is_refused_naming_the_file_section_key_and_valid_keys(tmp_path, extra, where, key):
    message = refused(workloads_file(tmp_path, BASE + extra))
    assert f"{where}: unknown key(s) {key}; valid keys: " in message, message


def test_an_unknown_decode_key_names_the_valid_ones(tmp_path):
    message = refused(workloads_file(tmp_path, "cpu:\n  runs: 3\n  warmup: 0\n"
                                               "  decode: {prompt: 16, tg: [8], depths: [0], tgs: [4]}\n"))
    assert "cpu.decode: unknown key(s) tgs; valid keys: prompt, tg, depths" in message, message


# -- (7) values that crashed later or passed as one sample ------------------------------------------------------
@pytest.mark.parametrize("text, key", [
    ("cpu:\n  runs: 0\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: [0]}\n", "cpu.runs"),
    ("cpu:\n  runs: 1\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: [0]}\n", "cpu.runs"),
    ("cpu:\n  runs: true\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: [0]}\n", "cpu.runs"),
    ("cpu:\n  runs: 3\n  warmup: -1\n  decode: {prompt: 16, tg: [8], depths: [0]}\n", "cpu.warmup"),
    ("cpu:\n  runs: 3\n  max_runs: 2\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: [0]}\n", "cpu.max_runs"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 0, tg: [8], depths: [0]}\n", "cpu.decode.prompt"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [1], depths: [0]}\n", "cpu.decode.tg[0]"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [true], depths: [0]}\n", "cpu.decode.tg[0]"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: [8], depths: [-1]}\n", "cpu.decode.depths[0]"),
    ("cpu:\n  runs: 3\n  warmup: 0\n  decode: {prompt: 16, tg: 8, depths: [0]}\n", "cpu.decode.tg"),
    (BASE + "  prefill: {pp: [0], depths: [0]}\n", "cpu.prefill.pp[0]"),
    (BASE + "  prefill: {pp: [128], depths: [-4]}\n", "cpu.prefill.depths[0]"),
    (BASE + "  latency: {pp: 512, tg: 1}\n", "cpu.latency.tg"),
    (BASE + "  latency: {pp: 0, tg: 32}\n", "cpu.latency.pp"),
    (BASE + "  concurrent: [{c: 0, pp: 128, tg: 32}]\n", "cpu.concurrent[0].c"),
    (BASE + "  concurrent: [{c: 2, pp: 128, tg: 1}]\n", "cpu.concurrent[0].tg"),
    (BASE + "  concurrent: {c: 2, pp: 128, tg: 32}\n", "cpu.concurrent"),
])
def test_a_bad_value_is_one_line_naming_its_key(tmp_path, text, key):
    message = refused(workloads_file(tmp_path, text))
    assert f"{key} is " in message and "fix the file" in message, message


SHIPPED = sorted((REPO / "tests").rglob("workloads*.yaml")) + sorted((REPO / "configs").rglob("workloads*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_workloads_file_loads_on_its_platforms(path):
    sections = yaml.safe_load(path.read_text())
    assert set(sections) <= {"cpu", "gpu"}, sections.keys()
    for section in sections:
        fit, _ = bench.load_workloads("cpu" if section == "cpu" else "sm_90", 10 ** 9, path)
        assert fit and all(w.runs >= 2 for w in fit)


# -- (3) the flags the server was booted with ---------------------------------------------------------------------
def test_flags_read_both_argparse_forms_and_the_last_occurrence_wins():
    argv = ["--dtype", "bfloat16", "--enforce-eager", "--max-num-batched-tokens=64", "--max-num-batched-tokens", "128",
            "--gpu-memory-utilization=0.5", "--gpu-memory-utilization=0.93"]
    assert flags(argv) == {"--dtype": "bfloat16", "--enforce-eager": "on", "--max-num-batched-tokens": "128",
                                     "--gpu-memory-utilization": "0.93"}
    # the same setting written either way is no change
    assert metadata.stack_changes({"vllm_flags": ["--max-num-seqs", "8"]}, {"vllm_flags": ["--max-num-seqs=8"]}) == []


def test_results_record_the_argv_and_env_the_server_was_booted_with(tmp_path, engine):
    """--server-arg values and the suite's own additions are in the booted argv, not in the config's spec.args: level 5
    names a flag change from the results, so they must hold what the server ran with."""
    booted = ["--dtype", "bfloat16", "--max-num-batched-tokens=64", "--gpu-memory-utilization", "0.12",
              "--profiler-config", json.dumps({"torch_profiler_dir": str(tmp_path / "traces")})]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    process = SimpleNamespace(argv_extra=booted, env_extra=env, pids=lambda: [], boot_memory=None)
    path = workloads_file(tmp_path, BASE)
    results = benchmark.run_benchmark(fake_suite(tmp_path, ["--max-num-batched-tokens=64"]),
                                      fake_server(engine, process=process), None, path)
    meta = results["metadata"]
    assert meta["vllm_flags"] == booted and meta["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "booted" in meta["vllm_flags_source"]
    baseline = {**meta, "vllm_flags": ["--dtype", "bfloat16"],
                "env_vars": {k: v for k, v in meta["env_vars"].items() if k != "VLLM_CPU_OMP_THREADS_BIND"}}
    changes = metadata.stack_changes(baseline, meta)
    assert "--max-num-batched-tokens (unset) -> 64" in changes and "--gpu-memory-utilization (unset) -> 0.12" in changes
    assert "VLLM_CPU_OMP_THREADS_BIND=(unset) -> 0" in changes
    # the profiler's trace folder is per run: never a stack change
    other_run = [*booted[:-1], json.dumps({"torch_profiler_dir": "/elsewhere"})]
    assert metadata.stack_changes({**meta, "vllm_flags": other_run}, meta) == []


def test_an_external_servers_flags_are_the_configs_and_say_so(tmp_path, engine):
    results = benchmark.run_benchmark(fake_suite(tmp_path), fake_server(engine), None, workloads_file(tmp_path, BASE))
    meta = results["metadata"]
    assert meta["vllm_flags"] == ["--dtype", "bfloat16"]
    assert meta["vllm_flags_source"] == "config (external server)"


# -- (8) broken results files ---------------------------------------------------------------------------------------
TRUNCATED = '{"config": "cpu-bf16", "platform": "cpu", "metrics": {"tg32": {"samp'


def test_results_are_written_with_the_atomic_writer(tmp_path, engine, monkeypatch):
    written = []
    monkeypatch.setattr(benchmark, "write_atomic", lambda path, text: written.append((path, json.loads(text))))
    results = benchmark.run_benchmark(fake_suite(tmp_path), fake_server(engine), None, workloads_file(tmp_path, BASE))
    assert [p for p, _ in written] == [Path(results["results_file"])] and written[0][1]["metrics"].keys() == {"tg8"}


def test_a_truncated_results_file_is_one_line_naming_it_in_the_run_report(tmp_path):
    broken = tmp_path / "results" / "tiny__cpu-bf16.json"
    broken.parent.mkdir()
    broken.write_text(TRUNCATED)
    with pytest.raises(SuiteError) as e:
        write_run_report(tmp_path)
    assert str(e.value) == f"cannot read results {broken} (JSONDecodeError); rerun level 4 to write it again"
    with pytest.raises(SuiteError, match="rerun level 4"):
        perf_results.read_results(broken)


@pytest.mark.parametrize("valid", ['"no"', "0", '"false"'])
def test_a_results_validity_that_is_not_true_or_false_is_one_line(tmp_path, valid):
    """`valid: false` (the kernel-path check failed) stops the level 5 gate; any other non-bool was read as valid."""
    odd = tmp_path / "tiny__cpu-bf16.json"
    odd.write_text('{"config": "cpu-bf16", "platform": "cpu", "metrics": {}, "valid": ' + valid + "}")
    with pytest.raises(SuiteError) as e:
        perf_results.read_results(odd)
    assert str(e.value).startswith(f"results {odd}: `valid` is ") and "rerun level 4" in str(e.value), e.value
    odd.write_text('{"config": "cpu-bf16", "platform": "cpu", "metrics": {}, "valid": true}')
    assert perf_results.read_results(odd)["valid"] is True


def test_the_nightly_merge_notes_a_broken_results_file_instead_of_dying(tmp_path):
    group = tmp_path / "nightly-marlin"
    (group / "results").mkdir(parents=True)
    (group / "results" / "tiny__marlin-bf16.json").write_text(TRUNCATED)
    ok, text = nightly.merge(nightly.load_set("gb10"), tmp_path)
    assert "(merged report not written: cannot read results" in text and "rerun level 4" in text, text


# -- (10) the GPU the benchmark ran on -----------------------------------------------------------------------------
FAKE_SMI = '''#!{python}
"""nvidia-smi --query-gpu: GPU 0 idle at 345 MHz, GPU 1 loaded at 1980 MHz; --id=N reads GPU N only."""
import sys
fields = next(a for a in sys.argv if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
ids = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--id=")]
for gpu in ids or ["0", "1"]:
    sm = "345 MHz" if gpu == "0" else "1980 MHz"
    power = "80.00 W" if gpu == "0" else "650.00 W"
    value = {{"index": gpu, "clocks.sm": sm, "clocks.max.sm": "1980 MHz", "power.draw": power}}
    print(", ".join(value.get(f, "x") for f in fields))
'''


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")


def test_gpu_metadata_reads_the_gpu_cuda_visible_devices_pins(fake_smi, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    state = metadata.gpu_state()
    assert (state["clocks.sm"], state["power.draw"]) == ("1980 MHz", "650.00 W"), state
    assert state["index"] == "1"


def test_gpu_metadata_reads_gpu_0_without_cuda_visible_devices(fake_smi, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    state = metadata.gpu_state()
    assert (state["index"], state["clocks.sm"], state["gpu_clocks"]) == ("0", "345 MHz", "default"), state


# -- (11) the peak memory's unit --------------------------------------------------------------------------------
def test_memory_peak_gb_is_in_gb():
    """The results' `memory_peak_gb` (and the report's "Peak mem (GB)") is GB, 1e9 bytes, as the 1 GB rule is."""
    sampler = MemorySampler(lambda: [])
    sampler.peak_gpu = 80 * 10 ** 9
    assert sampler.peak_gb == pytest.approx(80.0)
    sampler.peak_gpu, sampler.peak_rss = None, 5 * 10 ** 9
    assert sampler.peak_gb == pytest.approx(5.0)


# -- (9) the speculator's acceptance over the measured requests only ----------------------------------------------
def test_spec_decode_acceptance_counts_the_measured_requests_only(tmp_path, engine):
    """Warm-up rounds and the 2-token warm request before each round accept nothing here; tg32's requests accept 2 of
    3 drafts per step. The recorded acceptance is the measured requests': 1 + 2/1 = 3.0 tokens a step, 2/3 accepted."""
    engine.spec = True
    path = workloads_file(tmp_path, "cpu:\n  runs: 4\n  warmup: 3\n  decode: {prompt: 16, tg: [32], depths: [0]}\n")
    results = benchmark.run_benchmark(fake_suite(tmp_path), fake_server(engine, spec_axis="ngram"), None, path)
    counters = results["spec_decode"]["decode pp16/tg32"]
    assert counters["mean_acceptance_length"] == pytest.approx(3.0)
    assert counters["acceptance_rate"] == pytest.approx(0.6667)
    assert counters["drafts"] == 4 * (32 // 3)  # 4 measured rounds of one request


def test_truncated_verdicts_are_one_line_naming_them_in_the_run_report(tmp_path):
    """Level 5's verdicts file of a run killed while writing it once ended the run report in a JSONDecodeError."""
    recorded = Path(__file__).resolve().parents[2] / "docs/evidence/sm_90-2026-12-03-h200-marlin-rebaseline/aa1-results.json"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "gpt-oss-120b-shape__marlin-bf16.json").write_text(recorded.read_text())
    broken = tmp_path / "verdicts" / "gpt-oss-120b-shape__marlin-bf16.json"
    broken.parent.mkdir()
    broken.write_text('[{"name": "tg32", "sta')
    with pytest.raises(SuiteError) as e:
        write_run_report(tmp_path)
    assert str(e.value) == f"cannot read verdicts {broken} (JSONDecodeError); rerun level 5 to write them again"
