"""The suite's command-line options (loaded by conftest.py, and as a pytest entry point once installed).

Why a plugin: pytest picks its rootdir from path-like arguments before it reads any conftest.py, so
`--run-dir /existing/dir` (with a space) made it take /existing/dir for the rootdir, skip the suite's
conftest and fail with "unrecognized arguments: --run-dir". An entry-point plugin (installed by
scripts/setup.sh) is loaded before the options are parsed, so the option is known; pytest still picks
the rootdir from the path, so the plugin then stops the run with one line naming the `--run-dir=DIR` form,
which always works.
"""
from __future__ import annotations

import argparse
import os

import pytest


def positive_number(kind: type, env: str | None = None, most: float | None = None):
    """An option's type: a number above zero (a zero or negative timeout or round count would wait for nothing).
    `env`: the variable its default comes from, named in the error (the value may not be on the command line).
    `most`: an upper bound too (a memory fraction above 1)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0 or (most is not None and not value <= most):  # nan compares false both ways
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number above 0"
                                             + (f" and at most {most:g}" if most is not None else "") + f", got {text!r}"
                                             + (f" (from the option, or from {env})" if env else ""))
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    g = parser.getgroup("gpt-oss suite")
    g.addoption("--config", default=None, help="config name(s), comma separated, or 'all' (default: this platform's default)")
    g.addoption("--model", default=None, help="model alias, checkpoint dir or hub id (default: the embedded tiny gpt-oss)")
    g.addoption("--flavour", default=None, help="vLLM flavour: cpu, upstream, fork (default: from the platform and installed vLLM)")
    g.addoption("--server-url", default=None, help="test an already running OpenAI-compatible server instead of booting one")
    g.addoption("--platform", default=None,
                help="with --server-url: the server's platform (cpu, sm_90, sm_121, ...), which keys goldens, baselines and tolerances")
    g.addoption("--device", default=None, help="with --server-url: the server's device name (e.g. 'NVIDIA GB10'), which keys baselines")
    g.addoption("--list-configs", action="store_true", help="list configurations and whether this platform can run them")
    g.addoption("--run-dir", default=None, help="where run artifacts go (default: runs/<timestamp>)")
    g.addoption("--goldens-of", default=None,
                help="judge levels 2 against another configuration's goldens (same model and platform), e.g. a "
                     "kernel change against the stock backend: --config=gemv-bf16 --goldens-of=triton-bf16")
    g.addoption("--workloads", default=None, help="level 4 workloads YAML (default: tests/level4_perf/workloads.yaml)")
    g.addoption("--server-arg", action="append", default=[], metavar="--NAME=VALUE",
                help="extra vLLM option for every server the suite boots, after the config's own; repeatable "
                     "(e.g. --server-arg=--gpu-memory-utilization=0.93 for a plugin config on the 120b shape)")
    if not pluginmanager.has_plugin("regressions"):  # pytest.ini disables it; a run that missed pytest.ini has it
        g.addoption("--force-regen", action="store_true", default=False,
                    help="record goldens (levels 2, 6) and baselines (level 5) from this run; every recording test fails "
                         "so a recorded file is never taken for a pass (only runs whose kernel path passed level 1.5 "
                         "may record)")
    g.addoption("--allow-unverified", action="store_true", default=False,
                help="with --force-regen: record even where level 1.5 cannot vouch for the kernels (a config whose kernel "
                     "patterns no trace of this platform has confirmed yet, or a --server-url server the suite cannot "
                     "profile); the records say so")
    f = parser.getgroup("feature verdicts (pytest -m feature)")
    f.addoption("--feature", default=None, metavar="NAME[,NAME]|all",
                help="features of configs/features.yaml to judge against their baseline config (default with -m feature: "
                     "every feature of this run's flavour)")
    f.addoption("--against", default=None, metavar="BASELINE",
                help="judge --config=CANDIDATE against this config as an ad-hoc feature (criteria from --criteria)")
    f.addoption("--criteria", default=None, metavar="'tg32 >= +5%; used_memory <= +1 GB'",
                help="criteria of an ad-hoc feature, ';'-separated (default: no regression beyond 3%%, memory within 2 GB)")
    f.addoption("--strict-verdicts", action="store_true", default=False,
                help="an INCONCLUSIVE criterion fails the feature (the nightly's mode)")
    f.addoption("--feature-rounds", type=positive_number(int), default=None,
                help="measured rounds per side (default: the platform's level 4 `runs`)")
    f.addoption("--review-dir", default=None,
                help="where FEATURE_<name>.md reviews are written (default: docs/porting)")
    f.addoption("--level-timeout", type=positive_number(float), default=3600.0, help="seconds for a candidate's required levels")
    # a string default goes through `type` too, so a bad SUITE_BOOT_TIMEOUT is argparse's one line, not a plugin crash
    g.addoption("--boot-timeout", type=positive_number(float, "SUITE_BOOT_TIMEOUT"),
                default=os.environ.get("SUITE_BOOT_TIMEOUT", "900"), help="seconds to wait for /health (default: SUITE_BOOT_TIMEOUT, else 900)")


# Options whose value may be a path outside the repository (pytest then takes it for its rootdir).
_PATH_OPTIONS = ("--run-dir", "--workloads", "--model")


def pytest_configure(config: pytest.Config) -> None:
    """Reject the space-separated form when it made pytest miss the suite's pytest.ini (one line)."""
    if config.inipath is not None:
        return
    spaced = [a for a in config.invocation_params.args if a in _PATH_OPTIONS]
    if spaced:
        raise pytest.UsageError(
            f"`{spaced[0]} <path>` with a space made pytest take that path for its rootdir ({config.rootpath}) and miss "
            f"this suite's pytest.ini; write {spaced[0]}=<path>")
