#!/usr/bin/env bash
# Level 4/5 gate evidence on one GPU: a fresh baseline, five A/A boots against it, the 2% / 5%
# sensitivity curve on decode and prefill, +1.5 GiB held, the llama-benchy cross-check, and a summary.
#
#   export PYTHONPATH=/tmp/vllm-site            # vLLM 0.26 staged as in docs/gpu-lab.md
#   bash scripts/gpu_gates.sh PHASE [PHASE...]  # phases run in order; state is kept in $STATE (/tmp/suite-art)
#
# Phases (each fits a 10-minute call; ~3-4 min per boot of the gpt-oss-120b shape on an H200):
#   selftest   the plugin's %globaltimer spin: eager, in a CUDA graph, updated after capture (~30 s)
#   warm       one level 4 run, discarded: the first boot on a fresh machine compiles (torch.compile, Triton
#              JIT during the benchmark itself), which no baseline or A/A boot should measure. One round of
#              each of $WORKLOADS' workloads (the same shapes, so the same compiles): a full set took 754 s on a
#              fresh H200 (gpt-oss-120b shape, gemv-bf16: boot 279 s, benchmark 451 s)
#   baseline   record baselines/<gpu>/<model>/<config>.yaml with --force-regen (levels 1.5 + 4 + 5)
#   aa N       N A/A boots gated against that baseline (aa1, aa2, ... numbered across calls)
#   hooked     one boot with SUITE_HOOK_HOLD_GIB=1.5 SUITE_HOOK_SLOWDOWN=1: the sensitivity curve
#              (2% must pass, 5% must fail, decode and prefill) and the memory gate (+1.5 GiB must fail)
#   benchy     scripts/crosscheck_llama_benchy.py on its own boot (stops after one line while chat fails)
#   summary    $OUT/gates-summary.md from every phase so far (every phase also refreshes it)
#   all        selftest warm baseline aa 5 hooked benchy summary
# MODEL / CONFIG / WORKLOADS override the defaults (gpt-oss-120b-shape, triton-bf16, the quick GPU set);
# PYTEST_EXTRA adds pytest options to every run. STATE (default /tmp/suite-art) holds the recorded baselines and
# the runs ($STATE/gates): give each of several jobs on one host its own.
# SUITE_GIT_SHA=<sha> records the suite's commit where the tree arrives without .git.
set -uo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-gpt-oss-120b-shape}
CONFIG=${CONFIG:-triton-bf16}
WORKLOADS=${WORKLOADS:-tests/level4_perf/workloads-gpu-quick.yaml}
STATE=${STATE:-/tmp/suite-art}
# Run from a private copy of the tree. Our lab's device tool copies the working tree again at every call, and a
# phase that spans calls read what the copy put back: on 2026-12-02 an A/A boot begun after `baseline` was judged
# against the committed baseline, not the one recorded an hour before. The copy (.git included, so the suite's commit
# and dirty state are still read) is made once per invocation; baselines recorded by earlier invocations come from
# $STATE/baselines below.
STATE=$(realpath -m "$STATE")
case "$STATE/" in "$(pwd -P)/"*) echo "gpu_gates: STATE $STATE is inside the repository, which it copies; pass a folder outside it"; exit 2 ;; esac
mkdir -p "$STATE" || { echo "gpu_gates: STATE $STATE cannot be created; pass a writable folder"; exit 2; }
OUT=$(mkdir -p "${OUT:-/tmp/gates-out}" && cd "${OUT:-/tmp/gates-out}" && pwd -P) || { echo "gpu_gates: OUT cannot be created; pass a writable folder"; exit 2; }
# the run's own copy of the tree; models/.materialized is rebuilt from models/ on use (tests beside a run write it)
if [ "${GPU_GATES_TREE:-}" != "$(pwd -P)" ]; then
  tree=$STATE/tree
  rm -rf "$tree" && mkdir -p "$tree" || exit 2
  tar -C . --exclude=./runs --exclude=./.device-bundle --exclude=./.venv --exclude=./models/.materialized -cf - . | tar -C "$tree" -xf - || exit 2
  GPU_GATES_TREE=$tree STATE=$STATE OUT=$OUT exec bash "$tree/scripts/gpu_gates.sh" "$@"
fi
ART=$STATE/gates
mkdir -p "$ART" "$OUT" runs
export PYTHONUNBUFFERED=1 SUITE_BOOT_TIMEOUT=${SUITE_BOOT_TIMEOUT:-600}
unset SUITE_HOOK_HOLD_GIB SUITE_HOOK_SLOWDOWN
python3 -c "import vllm" 2>/dev/null || { echo "gpu_gates: vLLM is not importable; stage it (docs/gpu-lab.md) and export PYTHONPATH=/tmp/vllm-site"; exit 2; }
# baselines recorded by earlier calls on this machine (the working tree is re-synced every call)
[ -d "$STATE/baselines" ] && cp -r "$STATE/baselines/." baselines/
COMMON=(--model="$MODEL" --config="$CONFIG" --workloads "$WORKLOADS" -p no:cacheprovider -q ${PYTEST_EXTRA:-})

run_pytest() {  # NAME EXPECT -- pytest args
  local name=$1 expect=$2; shift 3
  local dir="$ART/$name" t0=$SECONDS
  rm -rf "$dir"
  python3 -m pytest "${COMMON[@]}" --run-dir="$dir" "$@" > "$ART/$name.log" 2>&1
  local rc=$?
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|  (pass|fail|inconclusive|improved) |measured ratio|slower" "$ART/$name.log" \
    | grep -vE "^\(|INFO|WARNING" | tail -40
  echo "$name: pytest rc=$rc ($expect) in $((SECONDS - t0)) s" | tee "$dir/pytest.status"
}

pack_out() {  # NAME TAR-ARGS...: $OUT/NAME, whole or not replaced
  local rc=0
  tar czf "$OUT/$1.part" "${@:2}" 2>/dev/null || rc=$?
  if [ $rc -le 1 ]; then  # 1: a file changed while read; the archive is whole
    mv -f "$OUT/$1.part" "$OUT/$1"
  else
    rm -f "$OUT/$1.part"; echo "gpu_gates: $OUT/$1 not updated (tar exit $rc)"
  fi
}

summary() {
  python3 scripts/gates_summary.py "$ART" "$OUT/gates-summary.md" || true
  # written aside, then renamed: a copy of $OUT taken meanwhile (scripts/gpu_bg.sh packs it every minute) got a
  # truncated gates-runs.tgz on an H200 when it read the file while tar still wrote it. A failed tar keeps the last
  # whole archive. The excludes come before -C: after the member names GNU tar ignores them (and exits 2)
  pack_out gates-baselines.tgz baselines  # $OUT returns files two folders deep at most
  pack_out gates-runs.tgz --exclude='*.pt.trace.json.gz' --exclude='pip_freeze.txt' -C "$ART" .
  pgrep -af "vllm.entrypoints" >/dev/null && echo "LEFTOVER vLLM PROCESSES" || true
}

phases=("$@"); [ ${#phases[@]} -eq 0 ] && phases=(all)
[ "${phases[0]}" = all ] && phases=(selftest warm baseline aa 5 hooked benchy summary)
i=0
while [ $i -lt ${#phases[@]} ]; do
  p=${phases[$i]}; i=$((i + 1))
  case $p in
    selftest)
      PYTHONPATH="$PYTHONPATH:$PWD/plugins/site" python3 -m suite_testhooks.spin 2>&1 | tee "$ART/selftest.log" | tail -12 ;;
    warm)
      python3 - "$WORKLOADS" "$STATE/warm-workloads.yaml" <<'EOF' || exit 2
import sys, yaml
try:
    sets = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
    for sec in sets.values():
        sec.update(runs=1, warmup=1, max_runs=1)
except (OSError, yaml.YAMLError, AttributeError) as e:
    sys.exit(f"gpu_gates warm: WORKLOADS={sys.argv[1]} is not a workloads file of cpu / gpu sections "
             f"(tests/level4_perf/workloads.yaml is one): {type(e).__name__}")
yaml.safe_dump(sets, open(sys.argv[2], "w", encoding="utf-8"), sort_keys=False)
EOF
      run_pytest warm "discarded" -- -m level4 -k test_benchmark --workloads "$STATE/warm-workloads.yaml" ;;
    baseline)
      run_pytest baseline "Regenerated expected" -- -m "level4 or level5" -k "no_regression" --force-regen
      mkdir -p "$STATE/baselines" && cp -r baselines/. "$STATE/baselines/" ;;
    aa)
      n=1; [[ ${phases[$i]:-} =~ ^[0-9]+$ ]] && { n=${phases[$i]}; i=$((i + 1)); }
      for _ in $(seq "$n"); do
        k=1; while [ -e "$ART/aa$k" ]; do k=$((k + 1)); done
        run_pytest "aa$k" "must pass" -- -m "level4 or level5" -k "no_regression or test_benchmark or unchanged"
      done ;;
    hooked)
      SUITE_HOOK_HOLD_GIB=1.5 SUITE_HOOK_SLOWDOWN=1 run_pytest hooked "must pass" -- -m level5 -k "sensitivity or held" ;;
    benchy)
      mkdir -p "$ART/benchy"
      python3 scripts/crosscheck_llama_benchy.py --model "$MODEL" --config "$CONFIG" --out "$ART/benchy" \
        > "$ART/benchy.log" 2>&1; rc=$?
      tail -8 "$ART/benchy.log"; echo "llama-benchy cross-check rc=$rc" | tee "$ART/benchy/crosscheck.status" ;;
    summary) ;;
    *) echo "gpu_gates: unknown phase $p (selftest warm baseline aa N hooked benchy summary all)"; exit 2 ;;
  esac
  summary
done
echo "summary: $OUT/gates-summary.md"
