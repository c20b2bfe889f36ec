#!/usr/bin/env bash
# The plugin's prefill on a lent Hopper GPU, in phases. A phase runs longer than one call of our lab's device tool (a
# warm boot plus two configs is ~15 minutes): start it under scripts/gpu_bg.sh and poll, e.g.
#
#   export PYTHONPATH=/tmp/vllm-site SUITE_GIT_SHA=<sha>      # vLLM staged as in docs/gpu-lab.md
#   bash scripts/gpu_bg.sh prefill 540 /tmp/prefill-out -- bash scripts/gpu_prefill.sh kernels level2 e2e
#
# Results go to PREFILL_DIR (default /tmp/prefill-out), never to $OUT: the device tool empties $OUT before every call,
# which deleted a phase's files (plugin_e2e's resume file among them) under the job still writing them. The job runs
# from its own copy of the tree ($PREFILL_DIR-tree beside it, made once per invocation, so that packing
# $PREFILL_DIR leaves it out): the tool copies the working tree again at every call, under a job that spans calls.
#
# Phases:
#   kernels   the prefill kernels' CUDA reference tests (every tiling, every live token-tile count, the MoE and
#             packed_mm tests under the tiling this GPU's tuning serves), then the MoE layer of the 120b shape
#             against a previous build of kernels/csrc/mxfp4_mma.cu in one process (`bench_prefill --ab`: 5
#             alternating rounds, outputs compared bit for bit). PREV names that build's source (default
#             .gpu-prev/mxfp4_mma.cu: the tool copies the working tree without .git, so write it before the call,
#             e.g. `mkdir -p .gpu-prev && git show 716179f:kernels/csrc/mxfp4_mma.cu > .gpu-prev/mxfp4_mma.cu`);
#             without it the A/B is against the mma.sync tiling (@1). Exit 1 when a test fails (then no A/B: its
#             verdict could not change that), or the served build is slower than PREV's (every round beyond every
#             round of it) or its output differs from PREV's by a bit (`--expect not-slower,identical`; EXPECT
#             replaces it, e.g. EXPECT=not-slower for a change that rounds differently by design). The layer is routed
#             with the served shape models' spread (ROUTING_SKEW, default served: bench_prefill --routing-skew; 0 routes
#             uniformly, as this phase did before 2026-12-07, whose ratios are not comparable with these): the uniformly
#             routed bench had read the 120b's 2048-token layer 12% faster than the served model ran it. Then the
#             dense layers' sweep at decode-batch sizes (DENSE_M; `bench_prefill --dense-m --only-dense-sweep`): what
#             places gemv.packed.decode_chunks_max_m and packed_mm.dequant_min_m; and the MoE layer at a decode batch's
#             tokens (BATCH_M, default 32,64,2048): served, 128 rows and MXFP4_STAGE_LIVE_ROWS 1 beside matmul_ogs.
#             Both printed, never the phase's verdict.
#   level2    level 2 of LEVEL2_CONFIG (default gemv-bf16: its quantization is stock's, so stock's goldens judge it) on the
#             tiny MXFP4 model against stock's goldens (`--goldens-of`), the mutation tests left out (they test the
#             suite's rules, not the kernels, and boot six more servers): streams, teacher forcing, perplexity, chat.
#             A kernel change that rounds differently must still pass it (the MoE down kernel's bf16 rows did not).
#   prefill   `pp2048_gpu` alone of stock and PLUGIN on MODEL, with one profiled prefill per config split by kernel
#             (plugin_e2e --prefill-gpu-only: e2e.md's prefill tables), two boots and no decode workloads.
#   e2e       stock and the plugin's MXFP4 config on MODEL (default gpt-oss-20b-shape) in one plugin_e2e run:
#             tg32 / tg128 at batch 1, tg32 at 4 and 32 concurrent requests, pp2048 on both clocks, memory.
#             The tiling comes from kernels/tuning.yaml (nothing forced): what users get.
#   e2e-aa    the plugin config twice in one run (its second entry with a no-op variable): the run-to-run spread
#             of every workload, which the ratios of `e2e` must exceed to mean anything.
#   batch     tg32 at 4 and 32 concurrent requests alone (plugin_e2e --batch-only, a warm boot first) of stock and PLUGIN
#             on MODEL: the M > 16 paths of candidate entries (e.g. PLUGIN=CONFIG,CONFIG+KERNELS_...=...) against stock,
#             one short boot each.
# Each phase writes a line `PHASE rc N` to $PREFILL_DIR/phases.txt; the phases after a failed `kernels` or `level2` are
# skipped, and the job exits 1 when any phase failed.
set -uo pipefail
cd "$(dirname "$0")/.."
RES=$(realpath -m "${PREFILL_DIR:-/tmp/prefill-out}")
MODEL=${MODEL:-gpt-oss-20b-shape}
PREV=${PREV:-.gpu-prev/mxfp4_mma.cu}
PLUGIN=${PLUGIN:-gemv-bf16-mxfp4-all}
LEVEL2_CONFIG=${LEVEL2_CONFIG:-gemv-bf16}
PHASES=(kernels level2 prefill e2e e2e-aa batch)
phase_list=$(IFS=,; echo "${PHASES[*]}" | sed 's/,/, /g')
[ $# -gt 0 ] || { echo "gpu_prefill: name a phase: $phase_list"; exit 2; }
for phase in "$@"; do  # all checked before any runs: a typo after a 20-minute phase would be found after it
  known=0
  for p in "${PHASES[@]}"; do [ "$p" = "$phase" ] && known=1; done
  [ $known = 1 ] || { echo "gpu_prefill: unknown phase '$phase'; phases: $phase_list"; exit 2; }
done
case "$RES/" in "$(pwd -P)/"*) echo "gpu_prefill: PREFILL_DIR $RES is inside the repository, which it copies; pass a folder outside it"; exit 2 ;; esac
mkdir -p "$RES" || { echo "gpu_prefill: PREFILL_DIR $RES cannot be created; pass a writable folder"; exit 2; }
if [ "${GPU_PREFILL_TREE:-}" != "$(pwd -P)" ]; then
  tree=$RES-tree
  rm -rf "$tree" && mkdir -p "$tree" || exit 2
  # GNU tar's exit 1 is "a file changed as it was read" (a test run writing beside the job): the copy still stands
  tar -C . --exclude=./runs --exclude=./.device-bundle --exclude=./.venv --exclude=./models/.materialized \
    --exclude=__pycache__ -cf - . | tar -C "$tree" -xf -
  made=("${PIPESTATUS[@]}")
  [ "${made[0]}" -le 1 ] && [ "${made[1]}" -eq 0 ] || { echo "gpu_prefill: cannot copy the tree to $tree"; exit 2; }
  GPU_PREFILL_TREE=$tree PREFILL_DIR=$RES exec bash "$tree/scripts/gpu_prefill.sh" "$@"
fi
export PYTHONUNBUFFERED=1
python3 -c "import vllm" 2>/dev/null || { echo "gpu_prefill: vLLM is not importable; stage it (docs/gpu-lab.md)"; exit 2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv > "$RES/gpu.txt" 2>&1

kernels() {
  local rc=0
  timeout 420 python3 -m pytest -p no:cacheprovider --noconftest -q -m gpu \
    tests/level1_5_kernels/test_kernel_packed_mm.py tests/level1_5_kernels/test_kernel_moe.py \
    > "$RES/kernel_tests.log" 2>&1 || rc=1
  tail -3 "$RES/kernel_tests.log"
  [ $rc -eq 0 ] || return $rc
  # the previous build first: the served one is judged against it (not slower in any round, output bit for bit)
  local ab=(--ab @1,served)
  [ -f "$PREV" ] && ab=(--ab "$PREV,served" --expect "${EXPECT:-not-slower,identical}")
  timeout 420 python3 -m kernels.tools.bench_prefill "${ab[@]}" --ab-m 8192,2048 --rounds 5 \
    --routing-skew "${ROUTING_SKEW:-served}" --out "$RES/ab.json" > "$RES/ab.log" 2>&1 || rc=1
  grep -v "^NVIDIA" "$RES/ab.log" | tail -12
  # the dense layers at a decode batch's M (tg32@c32 runs 32): the prefill kernel, the bf16 copy + cuBLAS and the
  # decode kernels in 16-row calls against cuBLAS on BF16 weights (stock's); a record, not a gate
  timeout 300 python3 -m kernels.tools.bench_prefill --dense-m "${DENSE_M:-17,32,48,63,64,256}" --only-dense-sweep \
    --out "$RES/dense_sweep.json" > "$RES/dense_sweep.log" 2>&1 || echo "dense sweep failed: $RES/dense_sweep.log"
  grep -E "M=|beats|FAILED" "$RES/dense_sweep.log" | tail -14
  # the MoE layer at a decode batch's tokens: served (64 rows there), 128 rows (@4) and padding rows staged as zeros
  # (MXFP4_STAGE_LIVE_ROWS 1), with stock's matmul_ogs in the same rounds; outputs bit for bit; a record, not a gate
  { echo '#define MXFP4_STAGE_LIVE_ROWS 1'; cat kernels/csrc/mxfp4_mma.cu; } > "$RES/live_rows.cu"
  timeout 420 python3 -m kernels.tools.bench_prefill --ab "served,@4,$RES/live_rows.cu" --ab-m "${BATCH_M:-32,64,2048}" \
    --rounds 5 --routing-skew "${ROUTING_SKEW:-served}" --out "$RES/batch_ab.json" > "$RES/batch_ab.log" 2>&1 \
    || echo "decode-batch A/B failed: $RES/batch_ab.log"
  grep -E "MoE M=|x the first|stock|FAILED" "$RES/batch_ab.log" | tail -16
  return $rc
}

level2() {
  local stock rc=0
  stock=$(stock_config) || return 2
  timeout 1200 python3 -m pytest -p no:cacheprovider -q -rs -m level2 --config="$LEVEL2_CONFIG" --goldens-of="$stock" \
    -k "not mutated" > "$RES/level2.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR|E +assert not)|passed|failed" "$RES/level2.log" | tail -6
  return $rc
}

stock_config() {
  # stock on this platform: configs/features.yaml baselines.upstream (triton-bf16 on Hopper)
  python3 -c 'from harness.core.platform import detect_platform
from harness.features.spec import flavour_baseline
print(flavour_baseline("upstream", detect_platform().name))'
}

# One plugin_e2e run on MODEL: NAME (its --out and log under RES), TIMEOUT in seconds, the e2e.md table to print
# (its header's second column, lines after the header), then plugin_e2e's arguments.
plugin_run() {
  local name=$1 limit=$2 column=$3 lines=$4
  shift 4
  timeout "$limit" python3 scripts/plugin_e2e.py --model "$MODEL" "$@" \
    --out "$RES/$name-$MODEL" > "$RES/$name-$MODEL.log" 2>&1
  local rc=$?
  grep -A"$lines" "^| config | $column" "$RES/$name-$MODEL/e2e.md" 2>/dev/null | head -$((lines + 2))
  return $rc
}

prefill() {
  local stock
  stock=$(stock_config) || return 2
  # no --warm: kernel time is not moved by a first boot's compiling
  plugin_run prefill 1200 MoE 4 --prefill-gpu-only --configs "$stock,$PLUGIN"
}

e2e() {
  local stock
  stock=$(stock_config) || return 2
  plugin_run e2e 1500 boot 8 --warm --configs "$stock,$PLUGIN"
}

e2e_aa() {
  # SUITE_AA=1 is read by nothing: the second boot is the same config, named apart in the table
  plugin_run aa 1500 boot 6 --warm --configs "$PLUGIN,$PLUGIN+SUITE_AA=1"
}

batch() {
  local stock
  stock=$(stock_config) || return 2
  plugin_run batch 1500 boot 8 --batch-only --warm --configs "$stock,$PLUGIN"
}

status=0
for phase in "$@"; do
  case $phase in
    kernels) kernels; rc=$? ;;
    level2) level2; rc=$? ;;
    prefill) prefill; rc=$? ;;
    e2e) e2e; rc=$? ;;
    e2e-aa) e2e_aa; rc=$? ;;
    batch) batch; rc=$? ;;
  esac
  echo "$phase rc $rc" | tee -a "$RES/phases.txt"
  [ $rc -eq 0 ] || status=1
  if { [ "$phase" = kernels ] || [ "$phase" = level2 ]; } && [ $rc -ne 0 ]; then
    echo "gpu_prefill: the $phase phase failed; the served model is not measured on a kernel that failed its tests"
    exit 1
  fi
done
exit $status
