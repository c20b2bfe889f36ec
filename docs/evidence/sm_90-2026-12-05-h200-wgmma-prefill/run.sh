#!/usr/bin/env bash
# experiment job (not committed): the wgmma prefill variants (3: RT 2, 1 CTA; 4: RT 1, 2 CTAs) on an H200
set -u
O=/tmp/wg; mkdir -p $O; cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
timeout 300 python -m pytest -p no:cacheprovider --noconftest -q -m gpu tests/level1_5_kernels/test_kernel_packed_mm.py -k "tilings_match or every_live_tile" > $O/tests.log 2>&1; trc=$?; echo "variant tests rc $trc"; tail -15 $O/tests.log
timeout 540 python -m kernels.tools.bench_prefill --ab served,@3,@4,@5,@6,@7,@8 --ab-m 8192,2048 --rounds 5 --out $O/ab.json > $O/ab.log 2>&1; echo "ab rc $?"
grep -v "^NVIDIA" $O/ab.log | tail -30
[ $trc -eq 0 ] || { echo "variant tests failed: no served run"; exit 1; }
best=$(python - <<'PY'
import json
r = json.load(open("/tmp/wg/ab.json"))["ab"]
med = r["M"]["8192"]["median_us"]
k = min(r["specs"][1:], key=lambda k: med[k])
print(k.split("@")[-1] if med[k] < med[r["specs"][0]] else "none")
PY
)
echo "fastest at 8192 (the 20b prefill's 256 slots per expert): variant $best" | tee $O/best.txt
[ "$best" = none ] && exit 0
KERNELS_PACKED_MM_CUDA_VARIANT=$best timeout 200 python -m pytest -p no:cacheprovider --noconftest -q -m gpu tests/level1_5_kernels/test_kernel_moe.py tests/level1_5_kernels/test_kernel_packed_mm.py > $O/moe_best.log 2>&1; echo "moe + packed_mm tests (variant $best) rc $?"; tail -3 $O/moe_best.log
timeout 900 python scripts/plugin_e2e.py --model gpt-oss-20b-shape --prefill-gpu-only \
  --configs gemv-bf16-mxfp4-all+KERNELS_PACKED_MM_CUDA_VARIANT=$best,triton-bf16 --out $O/e2e20 > $O/e2e20.log 2>&1
echo "e2e rc $?"; grep -A6 "^| config | boot" $O/e2e20/e2e.md | head -8
