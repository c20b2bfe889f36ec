#!/usr/bin/env bash
# The nightly job, step by step; .github/workflows/nightly-gb10.yml runs exactly these commands, and
# tests/unit/test_nightly.py runs them on CPU with the CPU config set. The config sets are data:
# configs/nightly.yaml (python -m harness.plugin.nightly does the work; this script is the plumbing).
#
#   bash scripts/nightly.sh plan     # the set's config groups as JSON (-> $GITHUB_OUTPUT groups=...)
#   bash scripts/nightly.sh setup    # check the vLLM to test: the users' image ($SUITE_VLLM_IMAGE) or the installed one
#   bash scripts/nightly.sh run      # strict preflight, then the set's levels for one group ($SUITE_GROUP)
#   bash scripts/nightly.sh merge    # every group's run -> $SUITE_NIGHTLY_DIR/merged, report, exit code
#   bash scripts/nightly.sh all      # one machine: every group in turn, then merge (what one runner does)
#
# Environment: SUITE_SET (default gb10), SUITE_GROUP, SUITE_NIGHTLY_DIR (default runs/nightly),
# SUITE_VLLM_IMAGE (a docker image with vLLM; empty: this machine's vLLM), SUITE_PYTHON (python inside
# the image, default python3), SUITE_CACHE (caches kept between nights, default ~/.cache/gpt-oss-suite),
# GITHUB_OUTPUT / GITHUB_STEP_SUMMARY (set by GitHub Actions; the markdown report goes to the summary).
# Extra arguments after the command go to pytest (run, all).
set -uo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}; shift || true
export SUITE_SET=${SUITE_SET:-gb10}
dir=${SUITE_NIGHTLY_DIR:-runs/nightly}
image=${SUITE_VLLM_IMAGE:-}
cache=${SUITE_CACHE:-$HOME/.cache/gpt-oss-suite}
# The workflow passes its repository variables as they are: an empty one is unset, not a path
[ -n "${TRITON_PTXAS_PATH:-}" ] || unset TRITON_PTXAS_PATH
[ -n "${CUDA_HOME:-}" ] || unset CUDA_HOME

# Run a command where the vLLM under test lives: inside the image (GPU, this checkout mounted at the same
# path, caches kept in $cache) or on this machine. The GPU slots' locks live in $cache/locks, where every container
# sees them: in each container's own /tmp a nightly and a run by hand would boot on the one GPU together.
in_env() {
  if [ -n "$image" ]; then
    mkdir -p "$cache"
    docker run --rm --gpus all --ipc=host --network host --user "$(id -u):$(id -g)" \
      -e HOME=/suite-cache -e SUITE_LOCK_DIR=/suite-cache/locks -v "$cache:/suite-cache" -v "$PWD:$PWD" -w "$PWD" \
      -e SUITE_SET -e SUITE_GROUP -e SUITE_NIGHTLY_ALLOW_UNVERIFIED -e SUITE_BOOT_TIMEOUT -e HF_TOKEN -e PYTHONUNBUFFERED=1 \
      -e TRITON_PTXAS_PATH -e CUDA_HOME \
      "$image" "$@"
  else
    "$@"
  fi
}

python_cmd() {  # the python that has vLLM and the suite's test stack
  if [ -n "$image" ]; then echo "${SUITE_PYTHON:-python3}"; return; fi
  local py
  py=$(bash scripts/setup.sh | tail -n 1) || return 1
  echo "$py"
}

summary() {  # append markdown to the job summary (and print it)
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then tee -a "$GITHUB_STEP_SUMMARY"; else cat; fi
}

gpus() {  # GPUs this runner can give the group's workers
  if [ -n "${SUITE_WORKERS:-}" ]; then echo "$SUITE_WORKERS"; return; fi
  # grep -c prints 0 itself when nothing matches (and exits 1): `|| echo 0` would print a second line
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; else echo 0; fi
}

run_group() {  # run_group GROUP [pytest args...]
  local group=$1; shift
  local py rc out="$dir/$group"
  py=$(python_cmd) || { echo "nightly: no usable python/vLLM (see the setup step)" >&2; return 1; }
  # a run folder left by an earlier night would be merged as tonight's if tonight's run stops before pytest
  rm -rf "$out" && mkdir -p "$out"
  in_env "$py" -m harness.plugin.nightly preflight --group "$group" || {
    echo "## ${SUITE_SET}/${group}: NOT RUN (preflight failed; see the job log)" | summary; return 1; }
  local args=() workers listed
  workers=$(gpus)
  # captured first: a failure inside `mapfile < <(...)` is invisible, and pytest then ran with no arguments at all
  listed=$(in_env "$py" -m harness.plugin.nightly pytest-args --group "$group" --dir "$out" --workers "$workers") || {
    echo "## ${SUITE_SET}/${group}: NOT RUN (the pytest arguments could not be made; see the job log)" | summary; return 1; }
  mapfile -t args <<< "$listed"
  echo "nightly: $py -m pytest ${args[*]} $*" >&2
  in_env "$py" -m pytest "${args[@]}" "$@"
  rc=$?
  [ "$rc" -eq 5 ] && echo "nightly: pytest collected no test for group $group" >&2
  in_env "$py" -m harness.plugin.nightly summary --dir "$out" --title "${SUITE_SET}/${group}" | summary
  return "$rc"
}

case "$cmd" in
  plan)
    py=$(python_cmd) || exit 1
    groups=$(in_env "$py" -m harness.plugin.nightly plan) || exit 1
    echo "$groups"
    [ -n "${GITHUB_OUTPUT:-}" ] && echo "groups=$groups" >> "$GITHUB_OUTPUT"
    exit 0 ;;
  setup)
    if [ -n "$image" ]; then
      docker image inspect "$image" >/dev/null 2>&1 || docker pull "$image" || exit 1
    fi
    py=$(python_cmd) || exit 1
    in_env "$py" -c "import vllm, pytest, yaml, requests, scipy, psutil; print('vLLM', vllm.__version__)" || {
      echo "nightly: the suite needs vLLM plus its test stack: python3 -m pip install -r requirements-gpu.txt" \
           "(in the image: a Dockerfile FROM it with that line; see docs/GB10.md)" >&2; exit 1; }
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L
    exit 0 ;;
  run)
    [ -n "${SUITE_GROUP:-}" ] || { echo "nightly: set SUITE_GROUP to one of the groups \`bash scripts/nightly.sh plan\` prints" >&2; exit 2; }
    run_group "$SUITE_GROUP" "$@"
    exit $? ;;
  merge)
    py=$(python_cmd) || exit 1
    mkdir -p "$dir"
    in_env "$py" -m harness.plugin.nightly merge --dir "$dir" | summary
    exit "${PIPESTATUS[0]}" ;;
  all)
    py=$(python_cmd) || exit 1
    groups=$(in_env "$py" -m harness.plugin.nightly plan) || exit 1
    rc=0
    for g in $(echo "$groups" | tr -d '[]",'); do
      run_group "$g" "$@" || rc=1
    done
    in_env "$py" -m harness.plugin.nightly merge --dir "$dir" | summary
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    exit "$rc" ;;
  *)
    sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
