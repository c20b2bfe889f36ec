"""The suite's command-line options (loaded by conftest.py, and as a pytest entry point once installed).

Why a plugin: pytest picks its rootdir from path-like arguments before it reads conftest.py, so with the
options only in conftest.py, `--run-dir /existing/dir` made pytest take /existing/dir for the rootdir,
skip the suite's conftest and reject `--run-dir`. An entry-point plugin is loaded before that parse.
"""
from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
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
    g.addoption("--workloads", default=None, help="level 4 workloads YAML (default: tests/level4_perf/workloads.yaml)")
    g.addoption("--boot-timeout", type=float, default=float(os.environ.get("SUITE_BOOT_TIMEOUT", 900)), help="seconds to wait for /health")
