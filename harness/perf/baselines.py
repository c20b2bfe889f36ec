"""Level 5 performance baselines: YAML files `baselines/<platform-key>/<model>/<config>.yaml`.

`<platform-key>` says which hardware the numbers belong to: `cpu-<cpu model slug>` on CPU (CPU results
depend on the CPU model, so they are keyed by it), the GPU name slug on GPUs (`nvidia-h100-80gb-hbm3`,
`nvidia-gb10`). A baseline file:

    version: 2                       # SCHEMA_VERSION; bumped when the layout changes (1 is still read)
    date: '2026-01-09T16:25:01+00:00'
    config: baseline
    model: tiny-gpt-oss-mxfp4
    platform: cpu                    # cpu / sm_90 / sm_121 ...
    device: AMD EPYC
    metadata: {...}                  # Phase 7 reproducibility metadata: vLLM version, git SHAs, flags, env
    workload: {...}                  # prompt/output lengths, runs, seed ...
    metrics:
      tg32: {samples: [31.5, 31.6, ...], unit: tok/s, higher_is_better: true,   # every run, not a mean
             clock: engine,                  # engine / client / kernel (older files: workload.pp_tg_clock)
             rounds: [{sm_mhz: 1980, mem_mhz: 3201, power_w: 412.0, ...}, ...]}  # clocks per sample (GPUs)
      ttft_ms: {samples: [...], unit: ms, higher_is_better: false}
    memory_used_gib: 63.1            # gated: weights + activation + non-torch + graphs (GPU) / boot RSS (CPU)
    kv_capacity_tokens: 1234567      # gated: vLLM's KV-cache capacity
    memory: {...}                    # where those came from: vLLM log lines, NVML / RSS readings, cross-check
    memory_peak_gb: 61.2             # informational; null when the platform cannot measure it

Schema 1 files (no used memory / KV capacity) still load; their memory verdicts are "inconclusive"
with the re-record command.

Records are written only from valid results (level 1.5 kernel-path check passed) with `--force-regen`,
and never with an `unresolved` metric (too few rounds at the loaded clock): such a baseline could never
judge that metric again.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from harness.core.errors import SuiteError
from harness.core.paths import slug
from harness.core.store import Store, regen_command, write_atomic
from harness.core.yamlfile import parse_yaml
from harness.core.platform import detect_platform
from harness.perf import metrics as perf

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)


def platform_key(platform_name: str, device: str) -> str:
    """Baseline directory for a platform: `cpu-<cpu model>` on CPU, the GPU name slug on CUDA.

    `platform_name` / `device` are `harness.core.platform.Platform.name` / `.device` (on CPU the device is the
    /proc/cpuinfo "model name").
    """
    if platform_name == "cpu":
        return f"cpu-{slug(device)}"
    return slug(device)


def current_platform_key() -> str:
    p = detect_platform()
    return platform_key(p.name, p.device)


def baseline_path(root: str | os.PathLike, platform_key: str, model: str, config: str) -> Path:
    return Path(root) / slug(platform_key) / _path_part(model, "model") / f"{_path_part(config, 'config')}.yaml"


def _path_part(name: str, what: str) -> str:
    # Keep names readable (config names are the user's words) but never let one escape its directory.
    if not name or name in (".", ".."):
        raise SuiteError(f"empty or relative {what} name {name!r}; pass a real {what} name")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def is_finite_number(x: object) -> bool:
    """A real int or float (not a bool), finite: what a sample or a memory number must be."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_metrics(metrics: object, where: str, positive: bool = False) -> None:
    """Schema of a `metrics` mapping (shared by baselines and results); raises SuiteError naming the field.

    `positive` (baselines): every sample must be > 0. Each entry is a rate or a latency, and the gate divides
    by the baseline's samples (median ratio, bootstrap resamples), so a 0 there is a broken recording, not a
    measurement. Memory numbers, which may be 0, are not metrics entries."""
    if not isinstance(metrics, Mapping) or not metrics:
        raise SuiteError(f"{where}: 'metrics' must be a non-empty mapping of metric name -> entry")
    for name, entry in metrics.items():
        at = f"{where}: metrics.{name}"
        if not isinstance(name, str) or not isinstance(entry, Mapping):
            raise SuiteError(f"{at} must be a mapping with samples, unit and higher_is_better")
        samples = entry.get("samples")
        if not isinstance(samples, list) or not samples or not all(is_finite_number(s) for s in samples):
            raise SuiteError(f"{at}.samples must be a non-empty list of finite numbers (got {_one_line(samples)[:60]})")
        if positive and not all(s > 0 for s in samples):
            raise SuiteError(f"{at}.samples must all be > 0: a rate or latency of {min(samples):g} cannot be a "
                             f"baseline (every gate ratio divides by it)")
        if "clock" in entry and not isinstance(entry["clock"], str):
            raise SuiteError(f"{at}.clock must name the clock it was measured with (engine, client, kernel)")
        for key in ("rounds", "flagged"):  # the GPU clocks of each round, read by the report and the gate
            rounds = entry.get(key)
            if rounds is not None and (not isinstance(rounds, list) or not all(isinstance(r, Mapping) for r in rounds)):
                raise SuiteError(f"{at}.{key} must be a list of one mapping of clocks per round (got {_one_line(rounds)[:60]})")
        if isinstance(entry.get("rounds"), list) and len(entry["rounds"]) != len(samples):
            raise SuiteError(f"{at}.rounds has {len(entry['rounds'])} entries for {len(samples)} samples: one per sample")
        if not isinstance(entry.get("higher_is_better"), bool):
            raise SuiteError(f"{at}.higher_is_better must be true or false")
        if not isinstance(entry.get("unit"), str):
            raise SuiteError(f"{at}.unit must be a string such as tok/s or ms")
        try:
            expected = perf.higher_is_better(name)
        except SuiteError:
            continue  # a metric this suite version does not know: accept its declared direction
        if entry["higher_is_better"] != expected:
            raise SuiteError(f"{at}.higher_is_better is {entry['higher_is_better']} but {name} is better when "
                             f"{'higher' if expected else 'lower'}")


def _check_memory(data: Mapping, where: str) -> None:
    if "memory_peak_gb" not in data:
        raise SuiteError(f"{where}: missing 'memory_peak_gb' (a number in GB, or null if not measurable)")
    mem = data["memory_peak_gb"]
    if mem is not None and not (is_finite_number(mem) and mem >= 0):
        raise SuiteError(f"{where}: 'memory_peak_gb' must be a non-negative number or null (got {_one_line(mem)[:40]})")


def check_baseline(data: object, where: str) -> None:
    if not isinstance(data, Mapping):
        raise SuiteError(f"{where}: top level must be a mapping (got {type(data).__name__})")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise SuiteError(f"{where}: missing or non-integer 'version' (this suite writes version {SCHEMA_VERSION})")
    if version not in READABLE_VERSIONS:
        raise SuiteError(f"{where}: schema version {version}, this suite reads versions "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    check_metrics(data.get("metrics"), where, positive=True)
    for name, entry in data["metrics"].items():
        # An unresolved baseline metric makes every later verdict on it inconclusive, whatever the change:
        # a 50% drop would pass as a warning, and a strict nightly would fail every night with nothing changed.
        if entry.get("unresolved"):
            raise SuiteError(f"{where}: metrics.{name} is unresolved ({_one_line(entry['unresolved'])[:160]}); a baseline "
                             "must be resolved: record it from a run on a quiet machine (GPU at its loaded clock) or "
                             "with more rounds (max_runs in tests/level4_perf/workloads.yaml)")
    _check_memory(data, where)
    if version >= 2:
        for key, ok in (("memory_used_gib", lambda v: is_finite_number(v) and v >= 0),
                        ("kv_capacity_tokens", lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0)):
            if key not in data:
                raise SuiteError(f"{where}: missing '{key}' (schema {version}; null if not measurable)")
            if data[key] is not None and not ok(data[key]):
                raise SuiteError(f"{where}: '{key}' must be a positive number or null (got {_one_line(data[key])[:40]})")
    for key in ("metadata", "workload", "memory", "clocks", "host_cpu"):
        if key in data and data[key] is not None and not isinstance(data[key], Mapping):
            raise SuiteError(f"{where}: '{key}' must be a mapping")
    for key in ("platform", "device", "config", "model"):  # they name the baseline's folder and its comparisons
        if data.get(key) is not None and not isinstance(data[key], str):
            raise SuiteError(f"{where}: '{key}' must be a string or null (got {_one_line(data[key])[:40]})")


def load_baseline(path: str | os.PathLike) -> dict:
    """Read and schema-check a baseline; every problem is a one-line SuiteError that names the fix."""
    path = Path(path)
    config, model = path.stem, path.parent.name
    fix = f"re-record it with: {regen_command('level5', config, model)}"
    if not path.is_file():
        raise SuiteError(f"no baseline at {path}; record one with: {regen_command('level5', config, model)}")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))  # a repeated key is an error: the last one won in silence
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or e
        raise SuiteError(f"baseline {path} is not valid YAML{at} ({_one_line(problem)}); fix it or {fix}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"cannot read baseline {path} ({_one_line(e)}); fix it or {fix}") from None
    try:
        check_baseline(data, f"baseline {path}")
    except SuiteError as e:
        raise SuiteError(f"{e}; fix it or {fix}") from None
    return dict(data)


def _plain(x: Any) -> Any:
    # Results carry numpy scalars, Paths and tuples; YAML's safe dumper only takes plain types.
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "item") and callable(x.item):  # numpy scalar
        return x.item()
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return x


def baseline_text(results: Mapping, stem: str) -> str:
    """`results` (the level 4 results dict) as a baseline file's text; refuses invalid results."""
    config = str(results.get("config") or stem)
    if results.get("valid") is not True:
        why = ("marked invalid (kernel-path check failed)" if results.get("valid") is False
               else "not marked valid (no passing kernel-path check recorded)")
        raise SuiteError(f"refusing to record a baseline for {config}: results are {why}; "
                         "fix the level 1.5 kernel-path failure and rerun the benchmark")
    doc = _plain({
        "version": SCHEMA_VERSION,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "flavour": results.get("flavour"),
        "model": results.get("model"),
        "model_fingerprint": results.get("model_fingerprint"),
        "platform": results.get("platform"),
        "device": results.get("device"),
        "metadata": results.get("metadata") or {},
        "workload": results.get("workload") or {},
        "metrics": {
            name: {k: entry.get(k) for k in ("samples", "unit", "higher_is_better", "clock", "rounds", "flagged",
                                             "unresolved")
                   if k in ("samples", "unit", "higher_is_better") or entry.get(k)}
            if isinstance(entry, Mapping) else entry
            for name, entry in (results.get("metrics") or {}).items()
        },
        "memory_used_gib": results.get("memory_used_gib"),
        "kv_capacity_tokens": results.get("kv_capacity_tokens"),
        "memory": results.get("memory") or {},
        "memory_peak_gb": results.get("memory_peak_gb"),
        "clocks": results.get("clocks") or {},
        "host_cpu": results.get("host_cpu") or {},
        # recorded with --allow-unverified: the record says which patterns its level 1.5 pass rested on
        **({"kernel_patterns_unverified": list(results["kernel_patterns_unverified"])}
           if results.get("kernel_patterns_unverified") else {}),
    })
    check_baseline(doc, f"results for {config}")  # never write a file that load_baseline would reject
    try:
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    except yaml.YAMLError as e:
        raise SuiteError(f"results for {config} hold a value YAML cannot store ({_one_line(e)[:80]})") from None


def save_baseline(path: str | os.PathLike, results: Mapping) -> Path:
    """Write `results` (the level 4 results dict, see harness.report.run_report) as a baseline; refuses invalid
    results."""
    path = Path(path)
    write_atomic(path, baseline_text(results, path.stem))
    return path


@dataclass
class BaselineStore:
    """One config's baseline for a run, through the record/compare store (harness.core.store): `settle(results)`
    keeps the would-be baseline in the run directory, records it under --force-regen (then the test fails), and
    otherwise returns the stored baseline."""

    path: Path
    store: Store

    def settle(self, results: Mapping) -> dict:
        config = str(results.get("config") or self.path.stem)
        if self.store.force_regen:
            text = baseline_text(results, self.path.stem)  # refuses results that may not become a baseline
            self.store.obtained(self.path, text)
            self.store.record(self.path, text, config, "recorded {path}; re-run without it to gate against it")
        try:
            self.store.obtained(self.path, baseline_text(results, self.path.stem))
        except SuiteError:
            # results that could not be a baseline (an unresolved metric, a failed kernel path) are still judged
            # against the stored one: their verdicts say what is unresolved; a re-record is not the fix
            pass
        return load_baseline(self.path)
