#!/usr/bin/env bash
# experiment (not for main): wider prefill tilings of the served kernel at 64..256 slots per expert
set -u
O=/tmp/wide; mkdir -p $O; cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
timeout 480 python -m kernels.tools.bench_prefill --ab served,@3,@4,@5,@6 --ab-m 8192,4096,2048 --rounds 5 --out $O/ab.json > $O/ab.log 2>&1; echo "ab rc $?"
grep -v "^NVIDIA" $O/ab.log | head -30
best=$(python - <<'PY'
import json
r = json.load(open("/tmp/wide/ab.json"))["ab"]
med = r["M"]["8192"]["median_us"]
print(min(r["specs"][1:], key=lambda k: med[k]).split("@")[-1])
PY
)
echo "fastest at 8192: variant $best" | tee $O/best.txt
KERNELS_PACKED_MM_CUDA_VARIANT=$best timeout 200 python -m pytest -p no:cacheprovider --noconftest -q -m gpu tests/level1_5_kernels/test_kernel_moe.py > $O/moe_best.log 2>&1; echo "moe tests (variant $best) rc $?"; tail -2 $O/moe_best.log
timeout 900 python scripts/plugin_e2e.py --model gpt-oss-20b-shape --prefill-gpu-only \
  --configs gemv-bf16-mxfp4-all+KERNELS_PACKED_MM_CUDA_VARIANT=$best,triton-bf16,gemv-bf16-mxfp4-all --out $O/e2e20 > $O/e2e20.log 2>&1
echo "e2e rc $?"; grep -A6 "^| config | boot" $O/e2e20/e2e.md | head -8
