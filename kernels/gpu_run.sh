#!/usr/bin/env bash
# One unattended GPU run of the decode kernels: kernel tests, benchmark, Nsight Compute counters, static SASS
# counts. Everything lands under $OUT (default ./gpu_out). Each stage has its own time limit so one
# failure cannot eat the others' time (total <= ~8 minutes on an H200 before the prefill tests joined the tests
# stage; their time there is not measured yet, hence its 300 s limit).
#   OUT=/some/dir bash kernels/gpu_run.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
PY=${PYTHON:-python}
export KERNELS_CACHE_DIR=${KERNELS_CACHE_DIR:-$OUT/.cache}
{
  echo "== $(date -Is) $(hostname)"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.txt"

echo "== build (nvcc, cached)"
timeout 90 $PY -c "
import time; t=time.time()
from kernels import cuda_ext
print('cuda_ext', cuda_ext.available(), round(time.time()-t, 1), 's')" 2>&1 | tee "$OUT/build.log"

echo "== tests (CPU-interpreter tests are covered on the dev box; here the gpu-marked ones + the rest compiled)"
# --noconftest: the kernel tests need only torch, triton and pytest (not the suite's server stack or syrupy).
# test_kernel_packed_mm.py: the served prefill (M > 16) on the same packed bytes, its CUDA kernel included. The
# inline PTX runs only here: on CPU the interpreter runs its Python emulation (kernels/NOTES.md).
timeout 300 $PY -m pytest -q -p no:cacheprovider --noconftest --maxfail=30 \
  tests/level1_5_kernels/test_kernel_gemv.py tests/level1_5_kernels/test_kernel_moe.py \
  tests/level1_5_kernels/test_kernel_packed_mm.py \
  tests/level1_5_kernels/test_kernel_quant.py tests/level1_5_kernels/test_kernel_formats.py \
  tests/level1_5_kernels/test_kernel_reference.py \
  --junitxml="$OUT/tests.xml" 2>&1 | tail -60 | tee "$OUT/tests.log"

echo "== bench"
timeout 210 $PY -m kernels.tools.bench --out "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"

echo "== ncu"
timeout 75 $PY -m kernels.tools.ncu_profile --out "$OUT" 2>&1 | tee "$OUT/ncu.log"

echo "== static SASS counts (this machine's nvcc; CI checks them against kernels/sass_budget.yaml with the pinned wheel)"
{ timeout 90 $PY -m kernels.tools.sass_count --arch 90a; timeout 90 $PY -m kernels.tools.sass_count --cuda --arch 121a; } \
  2>&1 | tee "$OUT/sass_count.txt"
echo "== done: $OUT"
