#!/usr/bin/env bash
# One time-boxed batch of suite runs on a lent GPU machine (vLLM staged as in docs/gpu-lab.md, PYTHONPATH set).
# Usage: bash scripts/gpu_batch.sh NAME -- <pytest args>
# Goldens, baselines and run artifacts are kept in /tmp/suite-art between calls (the working tree is
# re-synced from the developer's machine each call) and packed into $OUT/NAME.tgz.
set -uo pipefail
name=$1; shift; [ "${1:-}" = "--" ] && shift
art=/tmp/suite-art; mkdir -p "$art" runs
[ -d "$art/goldens" ] && cp -rn "$art/goldens/." goldens/ 2>/dev/null
[ -d "$art/baselines" ] && cp -rn "$art/baselines/." baselines/ 2>/dev/null
export PYTHONUNBUFFERED=1 SUITE_BOOT_TIMEOUT=420
nvidia-smi -L; python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
python3 -m pytest -p no:cacheprovider -q --run-dir "runs/$name" "$@" 2>&1 | tee "runs/$name.log" | grep -vE "^(\(|INFO|WARNING|DEBUG)" | tail -60
cp -r goldens baselines "$art/"
tar czf "${OUT:-/tmp}/$name.tgz" goldens baselines "runs/$name" "runs/$name.log" --exclude='*.pt.trace.json.gz' --exclude='pip_freeze.txt' 2>/dev/null
pgrep -af "vllm.entrypoints" && echo "LEFTOVER vLLM PROCESSES" || echo "no vLLM process left"
