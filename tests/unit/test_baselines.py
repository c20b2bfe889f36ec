"""harness.perf.baselines: layout, platform keys, schema errors, refusal to record invalid results."""
import numpy as np
import pytest
import yaml

from harness.core.errors import SuiteError
from harness.perf import baselines

REGEN = "pytest -m level5 --config=cutlass --force-regen"


def results(**over):
    r = {
        "config": "cutlass", "model": "tiny-gpt-oss-mxfp4", "platform": "sm_121", "device": "NVIDIA GB10",
        "valid": True,
        "metrics": {
            "tg32": {"samples": [np.float64(31.5), 31.6, 31.55], "unit": "tok/s", "higher_is_better": True,
                     "rounds": [{"sm_mhz": 1980.0, "mem_mhz": 3201.0, "power_w": 400.0}] * 3},
            "ttft_ms": {"samples": [555.0, 560.0, 557.5], "unit": "ms", "higher_is_better": False},
        },
        "workload": {"prompt_tokens": 2048, "output_tokens": 32, "runs": 3},
        "metadata": {"vllm_version": "0.11.0", "git_shas": {"vllm": "ac9f9330e"}},
        "memory_peak_gb": np.float32(61.25),
        "memory_used_gib": 62.93, "kv_capacity_tokens": 987654,
        "memory": {"used_source": "vLLM accounting", "engine": {"weights_gib": 61.4}},
    }
    r.update(over)
    return r


@pytest.fixture
def path(tmp_path):
    return baselines.baseline_path(tmp_path, "nvidia-gb10", "tiny-gpt-oss-mxfp4", "cutlass")


def assert_one_line_naming_fix(err, *needles):
    msg = str(err.value)
    assert "\n" not in msg
    for needle in (REGEN, *needles):
        assert needle in msg, msg


def test_layout(tmp_path):
    p = baselines.baseline_path(tmp_path, "cpu-amd-epyc", "tiny-gpt-oss", "baseline")
    assert p == tmp_path / "cpu-amd-epyc" / "tiny-gpt-oss" / "baseline.yaml"


def test_names_cannot_escape_the_baseline_root(tmp_path):
    p = baselines.baseline_path(tmp_path, "../../etc", "../m", "../../c")
    assert tmp_path in p.resolve().parents


@pytest.mark.parametrize("platform,device,key", [
    ("cpu", "AMD EPYC 7763 64-Core Processor", "cpu-amd-epyc-7763-64-core-processor"),
    ("cpu", "Intel(R) Xeon(R) Platinum 8480+", "cpu-intel-xeon-platinum-8480"),
    ("sm_90", "NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"),
    ("sm_121", "NVIDIA GB10", "nvidia-gb10"),
])
def test_platform_key(platform, device, key):
    assert baselines.platform_key(platform, device) == key


def test_save_then_load_round_trips_samples_and_metadata(path):
    written = baselines.save_baseline(path, results())
    assert written == path and path.is_file()
    b = baselines.load_baseline(path)
    assert b["version"] == baselines.SCHEMA_VERSION
    assert b["metrics"]["tg32"]["samples"] == [31.5, 31.6, 31.55]
    assert b["metrics"]["ttft_ms"]["higher_is_better"] is False
    assert b["memory_peak_gb"] == pytest.approx(61.25)
    assert (b["memory_used_gib"], b["kv_capacity_tokens"]) == (62.93, 987654)
    assert b["memory"]["used_source"] == "vLLM accounting"
    assert b["metrics"]["tg32"]["rounds"][0]["sm_mhz"] == 1980.0 and "rounds" not in b["metrics"]["ttft_ms"]
    assert b["metadata"]["git_shas"]["vllm"] == "ac9f9330e"
    assert b["device"] == "NVIDIA GB10" and b["config"] == "cutlass" and b["date"]
    assert "valid" not in b
    assert not list(path.parent.glob(".*.tmp"))


def test_missing_baseline_names_the_record_command(path):
    with pytest.raises(SuiteError) as e:
        baselines.load_baseline(path)
    assert_one_line_naming_fix(e, "no baseline", str(path))


def test_corrupt_yaml(path):
    path.parent.mkdir(parents=True)
    path.write_text("version: 1\nmetrics: {tg32: [unclosed\n  memory_peak_gb: 3\n")
    with pytest.raises(SuiteError) as e:
        baselines.load_baseline(path)
    assert_one_line_naming_fix(e, "not valid YAML")


GOOD = {"version": 1, "metrics": {"tg32": {"samples": [1.0], "unit": "tok/s", "higher_is_better": True}},
        "memory_peak_gb": 1.0}


@pytest.mark.parametrize("doc,needle", [
    ([1, 2], "top level"),
    ({k: v for k, v in GOOD.items() if k != "version"}, "version"),
    ({**GOOD, "version": 3}, "schema version 3"),
    ({**GOOD, "version": 2}, "missing 'memory_used_gib'"),
    ({**GOOD, "version": 2, "memory_used_gib": 1.0}, "missing 'kv_capacity_tokens'"),
    ({**GOOD, "version": 2, "memory_used_gib": -1.0, "kv_capacity_tokens": 10}, "memory_used_gib"),
    ({**GOOD, "version": 2, "memory_used_gib": 1.0, "kv_capacity_tokens": 1.5}, "kv_capacity_tokens"),
    ({**GOOD, "metrics": {}}, "metrics"),
    ({**GOOD, "device": 5090}, "'device' must be a string"),
    ({**GOOD, "platform": ["sm_90"]}, "'platform' must be a string"),
    ({**GOOD, "metrics": {"tg32": {"samples": "31.5", "unit": "tok/s", "higher_is_better": True}}}, "tg32.samples"),
    ({**GOOD, "metrics": {"tg32": {"samples": [], "unit": "tok/s", "higher_is_better": True}}}, "tg32.samples"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1, "x"], "unit": "tok/s", "higher_is_better": True}}}, "tg32.samples"),
    # every ratio the gate takes divides by the baseline: a rate or latency of 0 is a broken recording
    ({**GOOD, "metrics": {"tg32": {"samples": [0, 31.6], "unit": "tok/s", "higher_is_better": True}}}, "tg32.samples"),
    ({**GOOD, "metrics": {"itl_ms": {"samples": [4.1, 0.0], "unit": "ms", "higher_is_better": False}}}, "itl_ms.samples"),
    ({**GOOD, "metrics": {"tg32": {"samples": [-1.0], "unit": "tok/s", "higher_is_better": True}}}, "tg32.samples"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0], "unit": "tok/s", "higher_is_better": True, "unresolved": True}}},
     "tg32 is unresolved"),
    # the report and the gate read one mapping of GPU clocks per round
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0], "unit": "tok/s", "higher_is_better": True, "rounds": "zzz"}}},
     "tg32.rounds"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0, 2.0], "unit": "tok/s", "higher_is_better": True,
                                   "rounds": [{"sm_mhz": 1980}]}}}, "one per sample"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0], "unit": "tok/s", "higher_is_better": True, "flagged": [3.0]}}},
     "tg32.flagged"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0], "unit": "tok/s", "higher_is_better": "yes"}}}, "higher_is_better"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0], "higher_is_better": True}}}, "tg32.unit"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0], "unit": "tok/s", "higher_is_better": False}}}, "better when higher"),
    ({k: v for k, v in GOOD.items() if k != "memory_peak_gb"}, "memory_peak_gb"),
    ({**GOOD, "memory_peak_gb": "lots"}, "memory_peak_gb"),
])
def test_wrong_schema(path, doc, needle):
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SuiteError) as e:
        baselines.load_baseline(path)
    assert_one_line_naming_fix(e, needle)


V2 = {**GOOD, "version": 2, "memory_used_gib": 1.0, "kv_capacity_tokens": 10}


@pytest.mark.parametrize("doc, needle", [
    ({**GOOD, "version": 1}, None), ({**GOOD, "version": 0}, "schema version 0"),
    ({**GOOD, "version": True}, "non-integer 'version'"),  # YAML's `version: yes`: True == 1 in Python
    ({**V2, "kv_capacity_tokens": 1}, None), ({**V2, "kv_capacity_tokens": 0}, "kv_capacity_tokens"),
    ({**V2, "kv_capacity_tokens": True}, "kv_capacity_tokens"),
    ({**GOOD, "memory_peak_gb": 0.0}, None), ({**GOOD, "memory_peak_gb": -0.5}, "memory_peak_gb"),
    # a metric this suite does not know keeps its declared direction: it must be a real true or false
    ({**GOOD, "metrics": {"new_metric": {"samples": [1.0], "unit": "x", "higher_is_better": True}}}, None),
    ({**GOOD, "metrics": {"new_metric": {"samples": [1.0], "unit": "x", "higher_is_better": "no"}}}, "higher_is_better"),
    ({**GOOD, "metadata": {}, "workload": None}, None), ({**GOOD, "metadata": "vllm 0.26"}, "'metadata' must be a mapping"),
    ({**GOOD, "workload": ["pp512"]}, "'workload' must be a mapping"),
    ({**GOOD, "metrics": {"tg32": {"samples": [1.0, float("nan")], "unit": "tok/s", "higher_is_better": True}}},
     "tg32.samples"),  # NaN compares False with every bound: a gate on it passes any change
    ({**GOOD, "metrics": {"tg32": {"samples": [float("inf")], "unit": "tok/s", "higher_is_better": True}}}, "tg32.samples"),
])
def test_each_bound_of_a_baseline_holds_on_both_sides(path, doc, needle):
    """Just inside each bound loads, just outside is refused by name: schema versions start at 1 (a 0 or a `yes` is no
    version this suite wrote); the KV capacity the memory gate divides by is a positive token count (0 or `true` is a
    broken recording); the peak memory may be 0 but never negative; a metric's direction is a boolean (the string "no"
    is truthy: a lower-is-better metric read as higher-is-better); metadata and workload are mappings or absent."""
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(doc))
    if needle is None:
        assert baselines.load_baseline(path)["version"] == doc["version"]
    else:
        with pytest.raises(SuiteError) as e:
            baselines.load_baseline(path)
        assert_one_line_naming_fix(e, needle)


def test_good_minimal_schema_loads(path):
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({**GOOD, "memory_peak_gb": None}))
    assert baselines.load_baseline(path)["memory_peak_gb"] is None


def test_memory_numbers_of_zero_still_load(path):
    """Only rates and latencies must be > 0: a memory reading of 0 (nothing measured above the baseline) is valid."""
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({**GOOD, "version": 2, "memory_peak_gb": 0.0, "memory_used_gib": 0.0,
                                    "kv_capacity_tokens": None}))
    b = baselines.load_baseline(path)
    assert (b["memory_peak_gb"], b["memory_used_gib"]) == (0.0, 0.0)


def test_schema_1_baselines_still_load_and_schema_2_carries_used_memory(path):
    """Old baselines stay loadable (their memory verdicts say how to re-record); new ones record the gated numbers."""
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(GOOD))
    assert baselines.load_baseline(path)["version"] == 1
    path.write_text(yaml.safe_dump({**GOOD, "version": 2, "memory_used_gib": 62.9, "kv_capacity_tokens": 1234}))
    b = baselines.load_baseline(path)
    assert (b["memory_used_gib"], b["kv_capacity_tokens"]) == (62.9, 1234)


@pytest.mark.parametrize("over,needle", [({"valid": False}, "kernel-path check failed"),
                                         ({"valid": None}, "not marked valid")])
def test_save_refuses_invalid_results(path, over, needle):
    with pytest.raises(SuiteError, match=needle) as e:
        baselines.save_baseline(path, results(**over))
    assert "\n" not in str(e.value)
    assert not path.exists()


def test_save_refuses_results_with_an_unresolved_metric(path):
    """A baseline metric that is unresolved would make every later verdict on it inconclusive: never recorded."""
    r = results()
    r["metrics"]["tg32"]["unresolved"] = "only 7 of 16 rounds ran at the loaded clock (power cap)"
    with pytest.raises(SuiteError, match=r"tg32 is unresolved \(only 7 of 16 rounds.*quiet machine.*more rounds") as e:
        baselines.save_baseline(path, r)
    assert "\n" not in str(e.value)
    assert not path.exists()


def test_save_refuses_results_load_would_reject(path):
    with pytest.raises(SuiteError, match="samples"):
        baselines.save_baseline(path, results(metrics={"tg32": {"samples": [], "unit": "tok/s",
                                                                "higher_is_better": True}}))
    assert not path.exists()


def test_save_overwrites_an_existing_baseline(path):
    baselines.save_baseline(path, results())
    r = results()
    r["metrics"]["tg32"]["samples"] = [40.0, 40.5]
    r["metrics"]["tg32"]["rounds"] = r["metrics"]["tg32"]["rounds"][:2]
    baselines.save_baseline(path, r)
    assert baselines.load_baseline(path)["metrics"]["tg32"]["samples"] == [40.0, 40.5]


def test_a_baseline_of_other_embedded_weights_is_refused_by_name(path):
    """Re-training the embedded model changes its speed: that must read as 're-record', not as a regression."""
    from harness.perf.regression import Thresholds, compare_run

    baselines.save_baseline(path, results(model_fingerprint="aaaaaaaaaaaa"))
    base = baselines.load_baseline(path)
    assert compare_run(base, results(model_fingerprint="aaaaaaaaaaaa"), Thresholds())  # A/A: judged
    with pytest.raises(SuiteError, match=r"other weights of tiny-gpt-oss-mxfp4 \(fingerprint aaaaaaaaaaaa, this run: bbbbbbbbbbbb\); re-record"):
        compare_run(base, results(model_fingerprint="bbbbbbbbbbbb"), Thresholds())
