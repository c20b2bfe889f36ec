#!/usr/bin/env bash
# experiment job (not committed): the 256-token-row wgmma MoE tiling (PF variant 5) on a Hopper GPU
set -u
O=/tmp/wide; mkdir -p $O; cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv > $O/gpu.txt 2>&1
echo "== kernel tests $(date +%T)"
timeout 420 python3 -m pytest -p no:cacheprovider --noconftest -q -m gpu \
  tests/level1_5_kernels/test_kernel_packed_mm.py tests/level1_5_kernels/test_kernel_moe.py > $O/kernel_tests.log 2>&1
trc=$?; echo "kernel tests rc $trc"; tail -4 $O/kernel_tests.log
[ $trc -eq 0 ] || { echo "kernel tests failed: nothing else runs"; exit 1; }
echo "== ab $(date +%T)"
timeout 400 python3 -m kernels.tools.bench_prefill --ab @4,@5 --ab-m 8192,6144,4096,3072,2048 --rounds 5 \
  --out $O/ab.json > $O/ab.log 2>&1; echo "ab rc $?"
grep -v "^NVIDIA" $O/ab.log | grep -E "MoE M=|: .*x|stock" | tail -30
echo "== e2e 20b $(date +%T)"
timeout 1200 python3 scripts/plugin_e2e.py --model gpt-oss-20b-shape --warm \
  --configs triton-bf16,gemv-bf16-mxfp4-all,gemv-bf16-mxfp4-all+KERNELS_PACKED_MM_CUDA_MOE_WIDE_FROM=100000 \
  --out $O/e2e20 > $O/e2e20.log 2>&1; echo "e2e20 rc $?"
grep -A8 "^| config | boot" $O/e2e20/e2e.md | head -10
echo "== e2e 120b $(date +%T)"
timeout 1200 python3 scripts/plugin_e2e.py --model gpt-oss-120b-shape \
  --configs triton-bf16,gemv-bf16-mxfp4-all \
  --out $O/e2e120 > $O/e2e120.log 2>&1; echo "e2e120 rc $?"
grep -A8 "^| config | boot" $O/e2e120/e2e.md | head -10
echo "== done $(date +%T)"
