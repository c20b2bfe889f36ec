#!/usr/bin/env bash
# experiment (not for main): producer/consumer prefill kernel (variant 3) at 256 slots per expert
set -u
O=/tmp/pc; mkdir -p $O; cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
git_sha=$(cat .exp_sha 2>/dev/null); echo "tree $git_sha" > $O/tree.txt
KERNELS_PACKED_MM_CUDA_VARIANT=3 timeout 240 python -m pytest -p no:cacheprovider --noconftest -q -m gpu tests/level1_5_kernels/test_kernel_moe.py > $O/moe_v3.log 2>&1; echo "moe tests rc $?"
tail -3 $O/moe_v3.log
timeout 420 python -m kernels.tools.bench_prefill --ab served,@3 --ab-m 8192,2048 --rounds 5 --out $O/ab.json > $O/ab.log 2>&1; echo "ab rc $?"
tail -25 $O/ab.log
python - <<'PY' > $O/decide.txt
import json; r = json.load(open("/tmp/pc/ab.json"))
print(json.dumps(r, indent=1)[:3000])
PY
timeout 900 python scripts/plugin_e2e.py --model gpt-oss-20b-shape --prefill-gpu-only \
  --configs triton-bf16,gemv-bf16-mxfp4-all,gemv-bf16-mxfp4-all+KERNELS_PACKED_MM_CUDA_VARIANT=3 --out $O/e2e20 > $O/e2e20.log 2>&1
echo "e2e rc $?"; tail -20 $O/e2e20.log
